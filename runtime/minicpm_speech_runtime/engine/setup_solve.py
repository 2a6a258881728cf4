"""Cold setup: a group's prompts packed end to end into one solve.

A solve costs its rows x frames. Padded to a batch of 1, 2, 4 or 8 prompts and to the
group's longest prompt, the five to eight voices that a step sets up at 64 streams filled
about half of their setup solve, which took 83 of a step's 220 ms of kernels on the H200.
Packed end to end in one CFG row pair, a group costs its total frames, rounded up to a graph
bucket (67 ms in that step).

Each prompt still sees only itself, as in the reference's ``setup_cache`` of that voice alone:
its queries attend to its own keys (a key range per frame), its causal convs read zeros before
its first frame (a fresh cache), and its conv caches are its own last two frames. The keys and
values land at the segment's positions of one scratch row pair, from which the runner copies
them to the stream's slot.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from .estimator import BatchedEstimator, PackedRows, SolveInputs, load_inputs
from .graphs import Body, GraphDispatcher, GraphKey
from .transfer import to_device

KIND = "setup"


@dataclass(frozen=True, slots=True)
class PackLayout:
    """Where each prompt of a group sits in the packed row: ``[starts[i], starts[i] + lengths[i])``;
    frames from ``used`` to ``frames`` are padding, a segment of their own."""

    lengths: tuple[int, ...]
    frames: int

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 2:
            raise ValueError("a packed setup needs prompts of at least 2 frames each")
        if self.frames < self.used:
            raise ValueError(f"{self.used} prompt frames do not fit a solve of {self.frames}")

    @property
    def used(self) -> int:
        return sum(self.lengths)

    @property
    def starts(self) -> list[int]:
        return [0, *itertools.accumulate(self.lengths)][:-1]

    def segments(self) -> list[tuple[int, int]]:
        """[start, end) of every segment, the padding's included when there is any."""
        ends = list(itertools.accumulate(self.lengths))
        spans = list(zip(self.starts, ends, strict=True))
        return [*spans, (self.used, self.frames)] if self.used < self.frames else spans


def packed_indices(layout: PackLayout, conv_rows: int) -> dict[str, torch.Tensor]:
    """The host-built index tensors of one packed solve (2 CFG rows of ``layout.frames``).

    ``noise`` and ``segment``: per frame, its index within its segment (the reference's noise
    of a prompt starts at 0) and its segment's number (the padding's is ``len(lengths)``).
    """
    f, long = layout.frames, torch.long
    segment = torch.empty(f, dtype=long)
    first = torch.empty(f, dtype=long)
    end = torch.empty(f, dtype=long)
    for i, (a, b) in enumerate(layout.segments()):
        segment[a:b], first[a:b], end[a:b] = i, a, b
    frame = torch.arange(f, dtype=long)
    cache_src = torch.zeros(conv_rows, 2, dtype=long)  # rows past the group: never read
    for i, b in enumerate(itertools.accumulate(layout.lengths)):
        for cfg in range(2):
            cache_src[2 * i + cfg] = torch.tensor([b - 2, b - 1]) + cfg * f
    return {
        "write_pos": frame.repeat(2, 1),
        "key_range": torch.stack([first, end], dim=-1).repeat(2, 1, 1),
        "seg_first": first.repeat(2, 1),
        "cache_src": cache_src,
        "noise": frame - first,
        "segment": segment,
    }


class PackedSetupSolve:
    """Static buffers and graphs of packed setup solves: one key per frame bucket."""

    def __init__(
        self,
        est: BatchedEstimator,
        dispatcher: GraphDispatcher,
        frame_buckets: Sequence[int],
        max_voices: int,
    ) -> None:
        if est.slots != 1:
            raise ValueError("a packed setup solves one row pair")
        self.est, self.dispatcher, self.max_voices = est, dispatcher, max_voices
        self.conv_rows = est.conv.shape[2]
        if self.conv_rows < 2 * max_voices:
            raise ValueError("the estimator holds fewer conv caches than a group has voices")
        top, t = max(frame_buckets), est.frames
        if top >= t:
            raise ValueError(f"bucket of {top} frames leaves no trash position in {t}")
        self.trash = t - 1
        dev, dt = est.k.device, est.io_dtype
        self.x = torch.zeros(1, 80, top, device=dev, dtype=dt)
        self.mu, self.cond, self.spk, self.out = (torch.zeros_like(self.x) for _ in range(4))
        self.write = torch.full((2, top), self.trash, dtype=torch.long, device=dev)
        self.range = torch.zeros(2, top, 2, dtype=torch.long, device=dev)
        self.first = torch.zeros(2, top, dtype=torch.long, device=dev)
        self.cache_src = torch.zeros(self.conv_rows, 2, dtype=torch.long, device=dev)
        # every key is valid: each frame's range does the masking
        self.all_keys = torch.ones(2, 1, 1, t, dtype=torch.bool, device=dev)
        for fr in frame_buckets:
            key = GraphKey(KIND, 1, fr)
            dispatcher.declare(key, cast(Body, lambda key=key: self._body(key)), self._idle)

    def layout(self, lengths: Sequence[int]) -> tuple[PackLayout, GraphKey | None]:
        """The group's layout: as wide as the smallest bucket that holds it, or exact (eager)."""
        if len(lengths) > self.max_voices:
            raise ValueError(f"{len(lengths)} voices in a setup group of {self.max_voices}")
        key = self.dispatcher.select(KIND, 1, sum(lengths))
        return PackLayout(tuple(lengths), key.frames if key else sum(lengths)), key

    def run(
        self,
        layout: PackLayout,
        key: GraphKey | None,
        mus: Sequence[torch.Tensor],
        conds: Sequence[torch.Tensor],
        spks: Sequence[torch.Tensor],
    ) -> None:
        """Solve the group (``mus``, ``conds``: [80, P] each; ``spks``: [80] each); the
        scratch estimator then holds its keys, values and conv caches."""
        s = self._inputs(layout, mus, conds, spks)
        replay = None if key is None else self.dispatcher.replayer(key)
        if replay is None:
            self.est.solve(s)
            return
        load_inputs(self._views(layout.frames), s)
        replay()

    def _inputs(
        self,
        layout: PackLayout,
        mus: Sequence[torch.Tensor],
        conds: Sequence[torch.Tensor],
        spks: Sequence[torch.Tensor],
    ) -> SolveInputs:
        host = packed_indices(layout, self.conv_rows)
        names = list(host)
        flat = to_device(torch.cat([host[n].reshape(-1) for n in names]), self.x.device)
        dev: dict[str, torch.Tensor] = {}
        at = 0
        for n in names:
            dev[n] = flat[at : at + host[n].numel()].view(host[n].shape)
            at += host[n].numel()
        pad = layout.frames - layout.used
        zeros = self.x.new_zeros(80, pad)
        x = self.est.noise_at(dev["noise"])  # every prompt's noise starts at its frame 0
        spk = torch.stack([*spks, self.x.new_zeros(80)], dim=1)[:, dev["segment"]]
        empty = self.x.new_empty(0)
        return SolveInputs(
            0,
            1,
            x[None],
            torch.cat([*mus, zeros], dim=1)[None],
            spk[None],
            torch.cat([*conds, zeros], dim=1)[None],
            dev["write_pos"],
            self.all_keys,
            dev["key_range"],
            empty,
            empty,
            PackedRows(dev["seg_first"], dev["cache_src"]),
        )

    def _views(self, frames: int) -> SolveInputs:
        empty = self.x.new_empty(0)
        return SolveInputs(
            0,
            1,
            self.x[:, :, :frames],
            self.mu[:, :, :frames],
            self.spk[:, :, :frames],
            self.cond[:, :, :frames],
            self.write[:, :frames],
            self.all_keys,
            self.range[:, :frames],
            empty,
            empty,
            PackedRows(self.first[:, :frames], self.cache_src),
        )

    def _body(self, key: GraphKey) -> torch.Tensor:
        out = self.out[:, :, : key.frames]
        out.copy_(self.est.solve(self._views(key.frames)))
        return out

    def _idle(self) -> None:
        """Every frame writes to and attends to the trash position only."""
        for t in (self.x, self.mu, self.cond, self.spk, self.first, self.cache_src):
            t.zero_()
        self.write.fill_(self.trash)
        self.range[..., 0], self.range[..., 1] = self.trash, self.trash + 1
