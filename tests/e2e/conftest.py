"""The operator as a real process against the emulator (or the cluster KUBECONFIG names)."""

from __future__ import annotations

import pytest

# Short enough that a test sees several resyncs; long enough not to flood the emulator.
RESYNC_SECONDS = "2"


@pytest.fixture(autouse=True)
def fast_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINICPM_SPEECH_RESYNC_SECONDS", RESYNC_SECONDS)
