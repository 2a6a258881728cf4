"""Fixtures of the runtime tests: one tiny random-weight checkpoint per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from minicpm_speech_runtime.checkpoint import TINY, write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("code2wav-tiny"), TINY, seed=0)


@pytest.fixture(scope="session")
def models(tiny_checkpoint: Path):  # type: ignore[no-untyped-def]
    from minicpm_speech_runtime.assets import load_code2wav

    return load_code2wav(tiny_checkpoint, "cpu")
