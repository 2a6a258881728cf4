"""vLLM-Omni's own plugin loader finds this project's entry point, and registering is a no-op
when the deploy config leaves the runtime off and happens once when it turns it on."""

from __future__ import annotations

import asyncio
import importlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "vllm_omni", reason="vLLM-Omni is not installed here; `make test-vllm-omni` runs this lane"
)

from minicpm_speech_runtime.serving import plugin
from vllm_omni.plugins import (
    OMNI_DEFAULT_PLUGINS_GROUP,
    load_omni_plugins_by_group,
)

NAME = "minicpm_speech_code2wav"
ORCHESTRATOR_MODULE = "vllm_omni.engine.orchestrator"


def loaded_register() -> Callable[[], None]:
    plugins = load_omni_plugins_by_group(OMNI_DEFAULT_PLUGINS_GROUP)
    assert NAME in plugins, f"vLLM-Omni did not find {NAME}: {sorted(plugins)}"
    return plugins[NAME]


def test_loader_finds_register_and_a_second_load_patches_nothing(
    unpatched: type, deploy_config: Callable[..., Path], code2wav_originals: dict[str, Any],
    orchestrator_original: Any,
) -> None:
    deploy_config({"batched_code2wav": True})
    register = loaded_register()
    assert register is plugin.register
    register()
    wrapped = {name: unpatched.__dict__[name] for name in code2wav_originals}
    assert all(wrapped[n] is not code2wav_originals[n] for n in wrapped)
    assert getattr(unpatched, plugin.MARKER) is True

    # vLLM-Omni loads general plugins in every process, possibly more than once; a second
    # module import (a fresh ``_registered``) must not wrap the wrappers.
    register()
    plugin._registered = False
    loaded_register()()
    assert {n: unpatched.__dict__[n] for n in wrapped} == wrapped
    assert plugin.patch_code2wav(unpatched) is False
    orchestrator = importlib.import_module(ORCHESTRATOR_MODULE).OrchestratorBase
    assert orchestrator.__dict__[plugin.ORCHESTRATOR_WRAPPED] is not orchestrator_original
    assert plugin.patch_orchestrator(orchestrator) is False


def test_an_arriving_requests_voice_is_spooled_as_vllm_omni_reads_it(
    unpatched: type, deploy_config: Callable[..., Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM-Omni's orchestrator, wrapped: a chat request's reference, as its serving layer puts
    it on the prompt, is spooled when the request arrives, with the samples vLLM-Omni's
    stage-0 bridge hands on to stage 2; then vLLM-Omni's own method runs."""
    from minicpm_speech_runtime.fixtures.synth import voice_like
    from minicpm_speech_runtime.serving.arrivals import read_spooled, spool_name
    from minicpm_speech_runtime.serving.control import CONTROL_DIR_ENV
    from vllm_omni.model_executor.models.minicpmo_4_5.pipeline import (
        MINICPMO45_REFERENCE_AUDIO_KEY,
    )
    from vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni import (
        _extract_prompt_reference_audio,
    )

    deploy_config({"batched_code2wav": True, "reference_prep_workers": 2})
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path / "control"))
    loaded_register()()
    orchestrator_cls = importlib.import_module(ORCHESTRATOR_MODULE).Orchestrator
    orchestrator = orchestrator_cls.__new__(orchestrator_cls)
    failed: list[str] = []

    async def fail_request_client_error(request_id: str, *_: Any, **__: Any) -> None:
        failed.append(request_id)

    # vLLM-Omni's method fails a request without prompt token ids; it runs, as shipped.
    orchestrator._fail_request_client_error = fail_request_client_error
    stereo = np.stack([voice_like(2.0, 22050, seed=3), voice_like(2.0, 22050, seed=4)])
    prompt = {"prompt": "hello", MINICPMO45_REFERENCE_AUDIO_KEY: (stereo, 22050)}
    state = types.SimpleNamespace(final_stage_id=2, prompt=prompt)
    handed_on = asyncio.run(orchestrator._prewarm_async_chunk_stages(
        "chatcmpl-7", types.SimpleNamespace(prompt_token_ids=None), state))
    assert handed_on is False and failed == ["chatcmpl-7"]
    spooled = read_spooled(tmp_path / "control" / "arrivals" / spool_name("chatcmpl-7"))
    want, rate = _extract_prompt_reference_audio(prompt)
    assert spooled.sample_rate == rate == 22050
    assert np.array_equal(spooled.samples, want.numpy())


@pytest.mark.parametrize("extras", [None, {}, {"batched_code2wav": False, "micro_batch_size": 4}])
def test_runtime_off_leaves_vllm_omni_code2wav_as_shipped(
    unpatched: type,
    deploy_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    code2wav_originals: dict[str, Any],
    extras: dict[str, Any] | None,
) -> None:
    from minicpm_speech_runtime.serving.control import DEPLOY_CONFIG_ENV

    if extras is None:
        monkeypatch.delenv(DEPLOY_CONFIG_ENV, raising=False)
    else:
        deploy_config(extras)
    loaded_register()()
    assert {n: unpatched.__dict__[n] for n in code2wav_originals} == code2wav_originals
    assert not getattr(unpatched, plugin.MARKER, False)


def test_the_supervisor_accepts_every_code2wav_extra_vllm_omni_reads() -> None:
    """The supervisor refuses unknown Code2Wav extras (a misspelt option would otherwise be
    ignored); every key vLLM-Omni's own MiniCPM-o code reads there must pass."""
    import re

    import vllm_omni.model_executor.models.minicpmo_4_5 as package
    from minicpm_speech_contract.extras import BY_NAME

    models = Path(package.__file__).parent
    hook = models.parents[1] / "stage_input_processors" / "minicpmo_4_5_omni.py"
    sources = [*models.glob("*.py"), hook]
    read = set()
    for source in sources:
        read |= set(re.findall(r"extra(?:_config)?\.get\(\s*\"(\w+)\"", source.read_text()))
    assert {"codec_chunk_frames", "enable_cfm_graph", "token2wav_float16"} <= read  # the scan works
    assert read <= set(BY_NAME), sorted(read - set(BY_NAME))
