"""Fixtures of the vLLM-Omni lane (``make test-vllm-omni``): a random-weight model folder that
vLLM-Omni's own loader accepts, this project's models on the same weights, and the deploy
config the plugin reads. Nothing here imports vLLM-Omni until a fixture runs, so the main
suite, which lacks it, only collects the skips of the test modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

CODE2WAV_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.minicpmo_4_5_code2wav"
ORCHESTRATOR_MODULE = "vllm_omni.engine.orchestrator"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<model>/assets/token2wav`` plus the default prompt, as vLLM-Omni's Code2Wav reads them.

    The flow is the tiny one of the runtime tests; the speech tokenizer has the released
    dimensions because vLLM-Omni loads it with ``s3tokenizer.load_model``, which builds those.
    """
    from minicpm_speech_runtime.fixtures.checkpoint import TINY, write_random_checkpoint
    from minicpm_speech_runtime.fixtures.synth import wav_bytes

    root = tmp_path_factory.mktemp("minicpmo45")
    dims = dataclasses.replace(TINY, tokenizer_width=1280, tokenizer_layers=6)
    write_random_checkpoint(root / "assets" / "token2wav", dims, seed=0)
    (root / "assets" / "HT_ref_audio.wav").write_bytes(wav_bytes(2.0, 24000, seed=7))
    # flow.yaml names its classes ``cosyvoice2.*``; vLLM-Omni 0.30.0 neither ships nor
    # registers that module, and the reference package provides it as an alias.
    from stepaudio2.token2wav import _setup_cosyvoice2_alias

    _setup_cosyvoice2_alias()
    return root


@pytest.fixture(scope="session")
def our_models(model_dir: Path) -> Any:
    from minicpm_speech_runtime.assets import load_code2wav

    return load_code2wav(model_dir / "assets" / "token2wav", "cpu")


@pytest.fixture(scope="session")
def noise() -> torch.Tensor:
    """One CFM noise for every model under comparison (each flow draws its own at build)."""
    return torch.randn(1, 80, 30000, generator=torch.Generator().manual_seed(5))


@pytest.fixture(autouse=True, scope="session")
def code2wav_originals() -> dict[str, Any]:
    """``MiniCPMO45Code2Wav``'s methods the plugin wraps, as vLLM-Omni defines them."""
    import importlib

    from minicpm_speech_runtime.serving import plugin

    cls = importlib.import_module(CODE2WAV_MODULE).MiniCPMO45Code2Wav
    # Taken before any test of this session has registered the plugin.
    assert not getattr(cls, plugin.MARKER, False)
    return {name: cls.__dict__[name] for name in plugin.WRAPPED}


@pytest.fixture(autouse=True, scope="session")
def orchestrator_original() -> Any:
    """vLLM-Omni's ``OrchestratorBase._prewarm_async_chunk_stages`` as it ships."""
    import importlib

    from minicpm_speech_runtime.serving import plugin

    cls = importlib.import_module(ORCHESTRATOR_MODULE).OrchestratorBase
    assert not getattr(cls, plugin.MARKER, False)
    return cls.__dict__[plugin.ORCHESTRATOR_WRAPPED]


@pytest.fixture
def unpatched(
    monkeypatch: pytest.MonkeyPatch, code2wav_originals: dict[str, Any],
    orchestrator_original: Any,
) -> type:
    """vLLM-Omni's Code2Wav class and orchestrator as they ship, and the plugin never
    registered in this process; whatever the test does to any of them is undone after it."""
    import importlib

    from minicpm_speech_runtime.serving import plugin

    cls = importlib.import_module(CODE2WAV_MODULE).MiniCPMO45Code2Wav
    for name, method in code2wav_originals.items():
        monkeypatch.setattr(cls, name, method)
    monkeypatch.setattr(cls, plugin.MARKER, False, raising=False)
    orchestrator = importlib.import_module(ORCHESTRATOR_MODULE).OrchestratorBase
    monkeypatch.setattr(orchestrator, plugin.ORCHESTRATOR_WRAPPED, orchestrator_original)
    monkeypatch.setattr(orchestrator, plugin.MARKER, False, raising=False)
    monkeypatch.setattr(plugin, "_registered", False)
    return cls  # type: ignore[no-any-return]


def write_deploy_config(path: Path, extras: dict[str, Any]) -> Path:
    """A deploy config whose Code2Wav connector extras are ``extras`` (the plugin reads those)."""
    document = {"connectors": {"connector_of_shared_memory": {"extra": extras}}}
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def deploy_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``deploy_config(extras)`` writes a deploy config and exports it as the supervisor does."""
    from minicpm_speech_runtime.serving.control import DEPLOY_CONFIG_ENV

    def write(extras: dict[str, Any]) -> Path:
        path = write_deploy_config(tmp_path / "deploy.yaml", extras)
        monkeypatch.setenv(DEPLOY_CONFIG_ENV, str(path))
        return path

    return write


@pytest.fixture(scope="session")
def plugin_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plugin registered in this process with ``batched_code2wav: true`` in the deploy
    config, and the supervisor's control directory; yields that directory."""
    from minicpm_speech_runtime.serving import plugin
    from minicpm_speech_runtime.serving.control import CONTROL_DIR_ENV, DEPLOY_CONFIG_ENV

    root = tmp_path_factory.mktemp("run")
    deploy = write_deploy_config(root / "deploy.yaml", {"batched_code2wav": True})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DEPLOY_CONFIG_ENV, str(deploy))
        mp.setenv(CONTROL_DIR_ENV, str(root / "control"))
        plugin.register()
        yield root / "control"
