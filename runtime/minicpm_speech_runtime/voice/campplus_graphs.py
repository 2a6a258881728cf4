"""CUDA graphs of the torch CAM++ for a fixed grid of (batch, frames) shapes.

Eager CAM++ on a GPU is launch-bound (hundreds of small kernels per reference). Graphs are
captured at start-up, largest shape first in one shared memory pool, for every pair of
``batch_sizes`` x ``frame_buckets``; a call pads its batch to the smallest captured shape that
fits (the module masks padded frames, so rows do not change beyond float rounding) and falls
back to eager outside the grid. Static buffers are shared by every caller, so each use is
ordered after the previous one with an event, on whichever stream it runs, never a host wait.
"""

from __future__ import annotations

import threading
from typing import cast

import torch

FRAME_BUCKETS = (300, 500, 700, 1000, 1500, 2000, 3000)  # fbank frames: 100 per second
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


class CampPlusGraphs:
    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device,
        batch_sizes: tuple[int, ...] = BATCH_SIZES,
        frame_buckets: tuple[int, ...] = FRAME_BUCKETS,
    ) -> None:
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.module, self.device = module, device
        self.batch_sizes, self.frame_buckets = (
            tuple(sorted(batch_sizes)),
            tuple(sorted(frame_buckets)),
        )
        max_b, max_t = self.batch_sizes[-1], self.frame_buckets[-1]
        self._x = torch.zeros(max_b, max_t, 80, device=device)
        self._len = torch.full((max_b,), max_t, dtype=torch.long, device=device)
        self._out: dict[tuple[int, int], torch.Tensor] = {}
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._lock = threading.Lock()
        self._last_use: torch.cuda.Event | None = None
        self.replays = 0
        self.eager_calls = 0

    @torch.inference_mode()
    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for b in reversed(self.batch_sizes):
                for t in reversed(self.frame_buckets):
                    x, n = self._x[:b, :t], self._len[:b]
                    self.module(x, n)  # warm-up: cuDNN picks its algorithms outside capture
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=side):
                        self._out[(b, t)] = self.module(x, n)
                    self._graphs[(b, t)] = graph
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _shape_for(self, b: int, t: int) -> tuple[int, int] | None:
        bb = next((x for x in self.batch_sizes if x >= b), None)
        tt = next((x for x in self.frame_buckets if x >= t), None)
        if bb is None or tt is None or (bb, tt) not in self._graphs:
            return None
        return bb, tt

    @torch.inference_mode()
    def __call__(self, feats: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """feats [B, T, 80] on the device (zero-padded), lengths [B] or None -> [B, 192]."""
        b, t = feats.shape[0], feats.shape[1]
        shape = self._shape_for(b, t)
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.long, device=self.device)
        if shape is None:
            self.eager_calls += 1
            return cast(torch.Tensor, self.module(feats, lengths if b > 1 else None))
        stream = torch.cuda.current_stream(self.device)
        with self._lock:
            if self._last_use is not None:
                stream.wait_event(self._last_use)
            bb, _tt = shape
            self._x[:b, :t].copy_(feats, non_blocking=True)
            self._len[:b].copy_(lengths, non_blocking=True)
            if bb > b:
                self._len[b:bb].fill_(1)  # padding rows: a one-frame dummy reference
            self._graphs[shape].replay()
            out = self._out[shape][:b].clone()
            self._last_use = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._last_use.record(stream)  # type: ignore[no-untyped-call]
            self.replays += 1
        return out
