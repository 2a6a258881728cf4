"""The estimator's key/value frames, handed to streams by count. Host bookkeeping only.

A stream takes exactly the frames its prompt needs (:meth:`EngineConfig.stream_frames`, per CFG
row) when it starts and gives them back when it ends; which frames they are does not matter to
the solve, which reads every row through its frame table.
"""

from __future__ import annotations


class FramePool:
    """Frames ``[first, first + count)`` of the estimator's pool."""

    def __init__(self, first: int, count: int) -> None:
        self.capacity = count
        # a stack, lowest frame on top: a new pool hands out runs of adjacent frames, and a
        # stream that leaves hands its runs to the next one
        self._free = list(range(first + count - 1, first - 1, -1))

    @property
    def available(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if not 0 <= n <= len(self._free):
            raise RuntimeError(f"{n} cache frames asked for, {len(self._free)} free")
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        taken.reverse()
        return taken

    def give(self, frames: list[int]) -> None:
        self._free.extend(reversed(frames))
