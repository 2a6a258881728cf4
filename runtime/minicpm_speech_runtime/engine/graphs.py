"""CUDA graphs: which exist, what they cost, and how a call finds one. One dispatcher per engine.

The pattern is nano-vllm's: static buffers sized for the largest shape, one graph per grid key
``(kind, batch, frames, extra)`` captured largest first into one shared memory pool, and at run
time the smallest captured key that fits; its inputs are copied into ``buf[:batch]`` and the
output is sliced. The dispatcher's grid is the single source of truth for which graphs may
exist; anything off the grid, or refused by the budget, runs eager and is counted.

Owners (the estimator solves, the vocoder) declare their keys with a ``body`` (reads the static
buffers, returns the output) and an ``idle`` (puts the static buffers in a state whose run
changes no stream: every row inactive). A capture runs ``idle`` first, so capturing while
streams are live never touches their caches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Body = Callable[[], Any]


@dataclass(frozen=True, slots=True, order=True)
class GraphKey:
    kind: str  # "decode", "setup" (estimator solves), "hift" or "hift_tail" (last chunks)
    batch: int  # streams (estimator) or rows (vocoder)
    frames: int
    extra: int = 0  # vocoder: cached source samples


@dataclass(slots=True)
class GraphCounters:
    captures: int = 0
    captures_after_warmup: int = 0
    replays: int = 0
    refusals: int = 0  # budget exhausted or capture failed; the call ran eager
    eager: Counter[str] = field(default_factory=Counter)  # eager runs by kind (off grid/refused)


class CaptureBackend(Protocol):
    def capture(self, body: Body) -> Body:
        """Record ``body``; return a callable that replays it and returns its outputs."""


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` captures, all in one memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, body: Body) -> Body:
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            body()  # warm-up outside the graph: library handles, workspaces, autotuning
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = body()

        def replay() -> Any:
            graph.replay()
            return out

        return replay


class EagerBackend:
    """Capture = run once; replay = run again. Exercises the graph path's buffers on CPU."""

    def capture(self, body: Body) -> Body:
        body()
        return body


@dataclass(slots=True)
class _Entry:
    body: Body
    idle: Callable[[], None]


class GraphDispatcher:
    def __init__(self, budget: int, backend: CaptureBackend | None) -> None:
        self.budget, self.backend = budget, backend
        self.grid: dict[GraphKey, _Entry] = {}
        self.graphs: dict[GraphKey, Body] = {}
        self.errors: dict[GraphKey, str] = {}
        self.counters = GraphCounters()
        self.warm = False

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    def declare(self, key: GraphKey, body: Body, idle: Callable[[], None]) -> None:
        if self.enabled:
            self.grid[key] = _Entry(body, idle)

    def select(
        self, kind: str, batch: int, frames: int, extra: int | None = None
    ) -> GraphKey | None:
        """The smallest grid key of ``kind`` that holds ``batch`` x ``frames``; counts a miss.

        ``extra=None`` pads frames up to a bucket; an int asks for exact ``frames`` and ``extra``.
        """
        if not self.enabled:
            return None
        fits = [
            k for k in self.grid if k.kind == kind and k.batch >= batch and _fits(k, frames, extra)
        ]
        if not fits:
            self.counters.eager[kind] += 1
            return None
        return min(fits, key=lambda k: (k.batch, k.frames))

    def replayer(self, key: GraphKey) -> Body | None:
        """The key's graph, captured now if it is not yet; None (counted) if refused."""
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key)
        if graph is None:
            self.counters.eager[key.kind] += 1
            return None
        self.counters.replays += 1
        return graph

    def precapture(self, kinds: tuple[str, ...]) -> int:
        """Capture the grid, ``kinds`` in priority order, each largest first; returns captures."""
        before = self.counters.captures
        for kind in kinds:
            keys = sorted((k for k in self.grid if k.kind == kind), reverse=True)
            for key in keys:
                if key not in self.graphs:
                    self._capture(key)
        return self.counters.captures - before

    @property
    def budget_used(self) -> int:
        return len(self.graphs)

    def _capture(self, key: GraphKey) -> Body | None:
        entry = self.grid.get(key)
        if entry is None or self.backend is None:
            return None
        if len(self.graphs) >= self.budget:
            self._refuse(key, "graph budget exhausted")
            return None
        entry.idle()
        try:
            graph = self.backend.capture(entry.body)
        except RuntimeError as exc:  # e.g. a host copy or sync inside the body
            self.backend = None  # a failed capture can leave the allocator unusable for more
            self._refuse(key, f"capture failed: {exc}")
            return None
        finally:
            entry.idle()
        self.graphs[key] = graph
        self.counters.captures += 1
        self.counters.captures_after_warmup += int(self.warm)
        return graph

    def _refuse(self, key: GraphKey, why: str) -> None:
        self.grid.pop(key)  # never tried again: the next larger key serves these shapes
        self.errors[key] = why
        self.counters.refusals += 1
        return None

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "enabled": self.enabled,  # false after a failed capture: no more captures
            "graphs": len(self.graphs),
            "budget": self.budget,
            "captures": c.captures,
            "captures_after_warmup": c.captures_after_warmup,
            "replays": c.replays,
            "refusals": c.refusals,
            "eager": dict(c.eager),
            "errors": {
                f"{k.kind}/{k.batch}/{k.frames}/{k.extra}": v for k, v in self.errors.items()
            },
        }


def _fits(key: GraphKey, frames: int, extra: int | None) -> bool:
    if extra is None:
        return key.frames >= frames
    return key.frames == frames and key.extra == extra


def batch_grid(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself."""
    sizes = [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]
    return sizes if sizes[-1] == limit else [*sizes, limit]
