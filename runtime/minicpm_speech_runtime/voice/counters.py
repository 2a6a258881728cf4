"""Outcome counters of reference preparation; every request lands in exactly one outcome.

Per request, at chunk 0 (or at cancellation):
* ``ahead``: its job had finished; chunk 0 used the result.
* ``cached``: the voice was already prepared (another request, an earlier one).
* ``late``: its job had not finished; chunk 0 prepared inline.
* ``failed``: its job failed; bad audio fails the request, anything else falls back inline.
* ``queue_full``: the pool was full at arrival; chunk 0 prepared inline.
* ``inline``: no job was ever submitted; chunk 0 prepared inline.
* ``abandoned``: cancelled, or ended, before chunk 0 (queue-full requests excepted).
``inline_runs`` counts inline preparations themselves (late, failed, queue-full or unsubmitted).
"""

from __future__ import annotations

import threading
from collections import Counter

OUTCOMES = ("ahead", "cached", "inline", "late", "failed", "abandoned", "queue_full")


class PrepCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter({name: 0 for name in (*OUTCOMES, "inline_runs")})

    def add(self, name: str, n: int = 1) -> None:
        if name not in self._counts:
            raise KeyError(name)
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def total_outcomes(self) -> int:
        snap = self.snapshot()
        return sum(snap[name] for name in OUTCOMES)
