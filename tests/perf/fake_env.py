"""Shared helpers for driving the orchestrators with the fake server and client."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from minicpm_speech_perf.gpumem import MemoryReading

FAKES = Path(__file__).parent / "fakes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FixedSampler:
    """Stands in for NVML: a known peak per measured run."""

    def __init__(self, peak: float) -> None:
        self.peak = peak

    def __enter__(self) -> FixedSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def reading(self) -> MemoryReading:
        return MemoryReading(True, self.peak, 5)


def server_cmd(events: Path, port: int, name: str, *extra: str) -> list[str]:
    return [sys.executable, str(FAKES / "fake_server.py"), "--port", str(port),
            "--name", name, "--events", str(events), *extra]  # fmt: skip


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
