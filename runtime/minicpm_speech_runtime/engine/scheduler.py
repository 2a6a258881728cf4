"""Which streams set up and which decode in the next step. CPU only: no torch import.

A step is: end streams that must end (cancel, bad input, idle timeout), set up new voices in
groups of at most ``micro_batch`` (arrival order), then decode one chunk for every live stream
that has one ready, new streams' first chunks in the same solve as continuing streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import EngineConfig
from .state import Chunk, EndReason, Phase, StreamState


@dataclass(slots=True)
class StepPlan:
    ending: list[tuple[StreamState, EndReason]] = field(default_factory=list)
    setup_groups: list[list[StreamState]] = field(default_factory=list)
    decode: list[tuple[StreamState, Chunk]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.ending or self.setup_groups or self.decode)


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.streams: dict[object, StreamState] = {}
        self.cancelled: set[object] = set()

    def add(self, state: StreamState) -> None:
        if state.stream_id in self.streams:
            raise KeyError(f"stream {state.stream_id!r} already exists")
        self.streams[state.stream_id] = state

    def remove(self, stream_id: object) -> StreamState:
        self.cancelled.discard(stream_id)
        return self.streams.pop(stream_id)

    def plan(self, now: float, max_setups: int) -> StepPlan:
        plan = StepPlan()
        ordered = sorted(self.streams.values(), key=lambda s: s.order)
        for s in ordered:
            reason = self._end_reason(s, now)
            if reason is not None:
                plan.ending.append((s, reason))
        ending = {id(s) for s, _ in plan.ending}
        alive = [s for s in ordered if id(s) not in ending]
        new = [s for s in alive if s.phase is Phase.NEW][:max_setups]
        mb = self.config.micro_batch
        plan.setup_groups = [new[i : i + mb] for i in range(0, len(new), mb)]
        starting = {id(s) for s in new}
        for s in alive:
            if s.phase is Phase.LIVE or id(s) in starting:
                chunk = s.ready_chunk()
                if chunk is not None:
                    plan.decode.append((s, chunk))
        return plan

    def _end_reason(self, s: StreamState, now: float) -> EndReason | None:
        if s.stream_id in self.cancelled:
            return EndReason.CANCELLED
        if s.end_reason is not None:
            return s.end_reason
        if now - s.last_push > self.config.idle_timeout_s and s.ready_chunk() is None:
            return EndReason.IDLE_TIMEOUT
        return None
