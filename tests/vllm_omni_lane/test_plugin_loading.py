"""vLLM-Omni's own plugin loader finds this project's entry point, and registering is a no-op
when the deploy config leaves the runtime off and happens once when it turns it on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def loaded_register() -> Callable[[], None]:
    plugins = load_omni_plugins_by_group(OMNI_DEFAULT_PLUGINS_GROUP)
    assert NAME in plugins, f"vLLM-Omni did not find {NAME}: {sorted(plugins)}"
    return plugins[NAME]


def test_loader_finds_register_and_a_second_load_patches_nothing(
    unpatched: type, deploy_config: Callable[..., Path], code2wav_originals: dict[str, Any]
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
