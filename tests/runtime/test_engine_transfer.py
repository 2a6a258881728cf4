"""Step transfers: uploads leave device tensors alone; one download returns every PCM intact."""

from __future__ import annotations

import torch
from minicpm_speech_runtime.engine.transfer import to_device, to_host


def test_to_device_keeps_tensors_already_there_and_copies_host_ones() -> None:
    t = torch.arange(5, dtype=torch.int32)
    assert to_device(t, torch.device("cpu")) is t
    meta = torch.empty(3, device="meta")  # a tensor on another device is never pinned
    assert to_device(meta, torch.device("meta")) is meta


def test_to_host_returns_each_tensor_as_float32_in_order() -> None:
    parts = [torch.arange(4, dtype=torch.float64), torch.zeros(0), torch.tensor([7.5, -1.0])]
    got = to_host(parts)
    assert [g.dtype for g in got] == [torch.float32] * 3
    assert [g.tolist() for g in got] == [[0.0, 1.0, 2.0, 3.0], [], [7.5, -1.0]]
    assert to_host([]) == []
