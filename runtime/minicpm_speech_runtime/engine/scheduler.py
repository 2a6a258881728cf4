"""Which streams set up and which decode in the next step. CPU only: no torch import.

A step is: end streams that must end (cancel, bad input, idle timeout), set up new streams,
then decode one chunk for every live stream that has one ready, new streams' first chunks in the
same solve as continuing streams.

Setting up: a new stream whose voice is in the setup cache takes a copy (a hit); of the rest,
the first stream of each voice is set up cold, in groups of at most ``micro_batch``, and later
streams of the same voice copy their leader's result (followers). Every group of a step is
solved within that step; groups are formed in prompt-length order (arrival order among
equals), so a step's plan depends only on what is waiting. A group's prompts are packed end to
end in its solve, so they do not pad one another.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from .config import EngineConfig
from .state import Chunk, EndReason, Phase, StreamState


@dataclass(slots=True)
class StepPlan:
    ending: list[tuple[StreamState, EndReason]] = field(default_factory=list)
    setup_hits: list[StreamState] = field(default_factory=list)
    setup_groups: list[list[StreamState]] = field(default_factory=list)
    setup_followers: list[tuple[StreamState, StreamState]] = field(default_factory=list)
    decode: list[tuple[StreamState, Chunk]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.ending or self.setup_hits or self.setup_groups or self.decode)


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

    def plan(self, now: float, max_setups: int, cached: Container[str] = frozenset()) -> StepPlan:
        """``cached``: voice keys the setup cache holds now."""
        plan = StepPlan()
        ordered = sorted(self.streams.values(), key=lambda s: s.order)
        for s in ordered:
            reason = self._end_reason(s, now)
            if reason is not None:
                plan.ending.append((s, reason))
        ending = {id(s) for s, _ in plan.ending}
        alive = [s for s in ordered if id(s) not in ending]
        new = [s for s in alive if s.phase is Phase.NEW][:max_setups]
        leaders: dict[str, StreamState] = {}
        for s in new:
            if s.voice_key in cached:
                plan.setup_hits.append(s)
            elif s.voice_key in leaders:
                plan.setup_followers.append((s, leaders[s.voice_key]))
            else:
                leaders[s.voice_key] = s
        cold = sorted(leaders.values(), key=lambda s: (s.prompt_frames, s.order))
        mb = self.config.micro_batch
        plan.setup_groups = [cold[i : i + mb] for i in range(0, len(cold), mb)]
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
