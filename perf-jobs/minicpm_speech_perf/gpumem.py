"""Peak GPU memory during a run, sampled from NVML on a background thread.

NVML is optional: without the library or a driver the result says "unavailable" with the
reason, and never a made-up number.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """Peak device memory used during one run; `peak_mib` is None when unavailable."""

    available: bool
    peak_mib: float | None
    samples: int
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "peak_mib": self.peak_mib,
            "samples": self.samples,
            "reason": self.reason,
        }


class MemorySampler(Protocol):
    def __enter__(self) -> MemorySampler: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def reading(self) -> MemoryReading: ...


def _load_nvml() -> Any:
    import pynvml  # provided by nvidia-ml-py

    return pynvml


class NvmlSampler:
    """Samples `used` memory of one device every `interval_s` while inside the `with` block.

    Device-wide usage is recorded, not per-process: in a pod the server's PIDs are in
    another namespace view, and the Job's GPU runs nothing else.
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.2) -> None:
        self._index = device_index
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0
        self._samples = 0
        self._reason = ""
        self._nvml: Any = None
        self._handle: Any = None

    def __enter__(self) -> NvmlSampler:
        try:
            self._nvml = _load_nvml()
            self._nvml.nvmlInit()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)
            self._sample()
        except Exception as exc:  # ImportError or any NVMLError: record why, never fake
            self._reason = f"NVML unavailable: {type(exc).__name__}: {exc}"[:200]
            self._nvml = None
            return self
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._nvml is not None:
            try:
                self._sample()
                self._nvml.nvmlShutdown()
            except Exception as err:
                self._reason = f"NVML error at shutdown: {err}"[:200]

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._sample()
            except Exception as exc:
                self._reason = f"NVML sampling failed: {exc}"[:200]
                return

    def _sample(self) -> None:
        used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        self._peak = max(self._peak, used)
        self._samples += 1

    def reading(self) -> MemoryReading:
        if self._samples == 0:
            return MemoryReading(False, None, 0, self._reason or "no NVML sample taken")
        return MemoryReading(True, round(self._peak / MIB, 1), self._samples, self._reason)
