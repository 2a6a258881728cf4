"""vLLM-Omni's platform interface on vLLM's ``CpuPlatform``, built the way vLLM-Omni builds its
XPU platform: vLLM's platform class for everything vLLM asks, vLLM-Omni's for the stage workers.
It leans on vLLM 0.30.0 and vLLM-Omni 0.30.0 internals; the lane pins both exactly."""

from __future__ import annotations

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

WORKERS = "minicpm_speech_test_cpu_platform.workers"


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{WORKERS}.CpuARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{WORKERS}.CpuGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return cls.get_device_memory(device)[0]

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False
