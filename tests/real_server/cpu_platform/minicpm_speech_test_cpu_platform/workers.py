"""vLLM-Omni's stage workers and model runners on vLLM's CPU worker.

The workers mix vLLM-Omni's worker mixin into vLLM's ``CPUWorker`` and have it build these
runners in place of vLLM's ``CPUModelRunner``. The runners are vLLM-Omni's AR and generation
runners with the CPU-specific parts of vLLM's ``CPUModelRunner``: construction with CUDA events
and streams stubbed, device buffers pointed at their host halves, and no device syncs.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker import cpu_model_runner, cpu_worker
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin

# What CPUModelRunner overrides of GPUModelRunner, besides its constructor.
CPU_METHODS = (
    "_postprocess_tensors",
    "_postprocess_triton",
    "load_model",
    "get_model",
    "warming_up_model",
    "_init_device_properties",
    "_sync_device",
    "_zero_block_ids",
    "_to_list",
)

# Those methods on a GPUModelRunner. The runners below list it after vLLM-Omni's runner, so it
# sits between vLLM-Omni's classes and GPUModelRunner in their MRO: where vLLM-Omni overrides
# one of them (load_model, _to_list) its override runs and its super() call reaches the CPU one.
_CpuParts = type(
    "_CpuParts", (GPUModelRunner,), {name: CPUModelRunner.__dict__[name] for name in CPU_METHODS})


def _on_cpu(base: type) -> type:
    def __init__(self: Any, vllm_config: Any, device: torch.device) -> None:
        cpu_model_runner._set_torch_accelerator_to_noop()
        with cpu_model_runner._torch_cuda_wrapper():
            base.__init__(self, vllm_config, device)
        self.use_cuda_graph = False
        self.cascade_attn_enabled = False
        self._postprocess_tensors()
        self._postprocess_triton()

    return type(f"Cpu{base.__name__}", (base, _CpuParts), {"__init__": __init__})


CpuARModelRunner = _on_cpu(GPUARModelRunner)
CpuGenerationModelRunner = _on_cpu(GPUGenerationModelRunner)


class _CpuOmniWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type

    def init_device(self) -> None:
        # vLLM-Omni's hooks live in its v1 runners. CPUWorker.init_device builds the runner
        # its module names, once: have it build this worker's instead of vLLM's own.
        self.use_v2_model_runner = False
        vllm_runner = cpu_worker.CPUModelRunner
        cpu_worker.CPUModelRunner = self.model_runner_cls
        try:
            super().init_device()
        finally:
            cpu_worker.CPUModelRunner = vllm_runner


class CpuARWorker(_CpuOmniWorker):
    """Thinker and Talker stages."""

    model_runner_cls = CpuARModelRunner


class CpuGenerationWorker(_CpuOmniWorker):
    """The Code2Wav stage."""

    model_runner_cls = CpuGenerationModelRunner
