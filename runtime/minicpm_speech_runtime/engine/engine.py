"""The engine step: plan on the host, set up new voices, decode one batched chunk, emit PCM."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..assets import Code2WavModels
from .config import MIN_PROMPT_TOKENS, EngineConfig
from .graphs import CaptureBackend
from .runner import Runner
from .scheduler import Scheduler
from .state import EndReason, Phase, StreamState
from .transfer import to_host
from .workspace import bounded_convs


class VoiceRefused(ValueError):
    """A prepared voice this engine cannot set up; it belongs to its request alone."""


@dataclass(slots=True)
class ChunkOut:
    """One step's result for one stream; ``pcm`` is float32 24 kHz mono on the CPU."""

    stream_id: Any
    pcm: torch.Tensor
    finished: bool
    reason: str | None = None  # set when finished: "done" or why the stream ended early


@dataclass(slots=True)
class EngineCounters:
    steps: int = 0
    chunks: int = 0
    setups: int = 0  # streams set up by a solve
    setup_groups: int = 0  # batched setup solves
    setup_hits: int = 0  # streams set up from the setup cache
    setup_shared: int = 0  # streams set up from a same-voice stream's solve in the same step
    audio_samples: int = 0
    ended: Counter[str] = field(default_factory=Counter)


class Code2WavEngine:
    def __init__(
        self,
        models: Code2WavModels,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        graph_backend: CaptureBackend | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.clock = clock
        self.scheduler = Scheduler(self.config)
        self.counters = EngineCounters()
        self._lock = threading.Lock()
        self._order = 0
        if models.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.config.tf32
            torch.backends.cudnn.allow_tf32 = self.config.tf32
        self.runner = Runner(models, self.config, graph_backend)
        self.up_rate = models.up_rate

    # public API
    def check_voice(self, voice: Any) -> None:
        """Raise :class:`VoiceRefused`, naming the field, for a voice the engine cannot set up."""
        frames = int(voice.prompt_mels.shape[1])
        tokens = int(voice.prompt_tokens.shape[1])
        if frames > self.config.max_prompt_frames:
            raise VoiceRefused(
                f"voice prompt_mels: {frames} frames > max_prompt_frames "
                f"({self.config.max_prompt_frames}); use a shorter reference or raise it"
            )
        for name in ("prompt_mels", "spk_emb"):
            # a packed setup solves a group's prompts in one row: a NaN would reach them all
            if not bool(torch.isfinite(getattr(voice, name)).all()):
                raise VoiceRefused(f"voice {name}: holds NaN or Inf; prepare the voice again")
        if tokens < MIN_PROMPT_TOKENS or frames != self.up_rate * tokens:
            # one token leaves the encoder a lookahead cache too short to continue from (the
            # reference fails there too); voice preparation never makes one (0.5 s at least)
            raise VoiceRefused(
                f"voice prompt_mels: {frames} frames for {tokens} prompt tokens; a prepared "
                f"voice has {self.up_rate} frames per token and at least {MIN_PROMPT_TOKENS} tokens"
            )

    def admits(self, voice: Any) -> bool:
        """Whether :meth:`add_stream` takes a stream of this voice now: a free slot, and the
        cache frames its prompt needs (a stream that ends frees both in a step)."""
        with self._lock:
            return self.runner.admits(int(voice.prompt_mels.shape[1]))

    def add_stream(self, stream_id: Any, voice: Any) -> None:
        """Start a stream with a prepared voice (:class:`~..device.PreparedVoice`); a voice the
        engine cannot set up is refused here (ValueError), before it joins any step, and a
        stream the engine has no room for now (RuntimeError: no free stream slot, or no free
        cache frames; :meth:`admits` says beforehand)."""
        self.check_voice(voice)
        frames = int(voice.prompt_mels.shape[1])
        with self._lock:
            s = StreamState(stream_id, voice, voice.key, frames, self._order, self.clock())
            self.scheduler.add(s)
            self._order += 1
            try:
                self.runner.attach(s)
            except RuntimeError:
                self.scheduler.remove(stream_id)
                raise

    def push_tokens(self, stream_id: Any, tokens: list[int], last: bool = False) -> None:
        with self._lock:
            s = self.scheduler.streams[stream_id]
            reason = s.push(list(tokens), last, self.clock())
            if reason is not None and s.end_reason is None:
                s.end_reason = reason

    def cancel(self, stream_id: Any) -> None:
        """End a stream at the next step boundary; a solve in flight finishes for the others."""
        with self._lock:
            if stream_id in self.scheduler.streams:
                self.scheduler.cancelled.add(stream_id)

    def precapture(self) -> int:
        """Capture every graph of the grid now (decode shapes first); returns how many."""
        with self._lock, self._bounded_convs():
            return self.runner.precapture()

    def warmup(self) -> int:
        """Precapture (when configured); from here on a capture counts as one after warm-up."""
        n = self.precapture() if self.config.precapture else 0
        self.runner.graphs.warm = True
        return n

    def graph_stats(self) -> dict[str, Any]:
        """Graphs, budget, captures (after warm-up too), replays, refusals, eager runs by kind."""
        return self.runner.graphs.stats()

    @property
    def num_streams(self) -> int:
        return len(self.scheduler.streams)

    @property
    def free_slots(self) -> int:
        """Free stream slots; a stream that ends frees its slot in a step. Whether a stream
        also finds its cache frames: :meth:`admits`."""
        return self.config.max_streams - self.runner.num_live

    def has_output(self, stream_id: Any) -> bool:
        """Whether the next step emits something for this stream: a chunk, or its end."""
        with self._lock:
            s = self.scheduler.streams.get(stream_id)
            if s is None:
                return False
            cancelled = stream_id in self.scheduler.cancelled
            return cancelled or s.end_reason is not None or s.ready_chunk() is not None

    def step(self) -> list[ChunkOut]:
        with torch.profiler.record_function("engine.step"), self._bounded_convs():
            return self._step()

    def _step(self) -> list[ChunkOut]:
        with self._lock, self.runner.phase("plan"):
            plan = self.scheduler.plan(
                self.clock(), self.config.max_streams, self.runner.setup_cache
            )
        out = [self._end(s, reason) for s, reason in plan.ending]
        # hits copy before any cold setup of this step can evict their entry
        for s in plan.setup_hits:
            self.runner.setup_from_cache(s)
            s.phase = Phase.LIVE
            self.counters.setup_hits += 1
        if plan.setup_groups:
            self.runner.setup(plan.setup_groups)
        for group in plan.setup_groups:
            for s in group:
                s.phase = Phase.LIVE
            self.counters.setups += len(group)
            self.counters.setup_groups += 1
        for s, leader in plan.setup_followers:
            self.runner.copy_setup(leader, s)
            s.phase = Phase.LIVE
            self.counters.setup_shared += 1
        if plan.decode:
            out += self._decode(plan.decode)
        self.counters.steps += 1
        return out

    # internals
    def _bounded_convs(self) -> contextlib.AbstractContextManager[None]:
        return bounded_convs(self.config.bounded_convs and not self.config.tf32)

    def _decode(self, batch: list) -> list[ChunkOut]:  # type: ignore[type-arg]
        pcm = self.runner.decode(batch)
        with self.runner.phase("to_host"):
            pcm = to_host(pcm)
        out = []
        for (s, chunk), wav in zip(batch, pcm, strict=True):
            s.consume(chunk)
            self.counters.chunks += 1
            with self._lock:
                cancelled = s.stream_id in self.scheduler.cancelled
            if cancelled:
                out.append(self._end(s, EndReason.CANCELLED))
                continue
            if not bool(torch.isfinite(wav).all()):
                # Rows of a batch never mix, so only this stream's caches can hold the NaN:
                # cleared before its slot is reused, where a masked key still meets 0 * NaN.
                s.end_detail = "its decoded audio held NaN or Inf"
                self.runner.scrub(s)
                # Its set-up may be where the NaN came from (an overflow in the prompt's solve):
                # kept, it would end every later stream of the voice the same way. Solved again.
                self.runner.setup_cache.discard(s.voice_key)
                out.append(self._end(s, EndReason.NON_FINITE))
                continue
            self.counters.audio_samples += wav.shape[0]
            out.append(ChunkOut(s.stream_id, wav, chunk.last, "done" if chunk.last else None))
            if chunk.last:
                self._release(s, EndReason.DONE)
        return out

    def _end(self, s: StreamState, reason: EndReason) -> ChunkOut:
        self._release(s, reason)
        detail = f"{reason.value}: {s.end_detail}" if s.end_detail else reason.value
        return ChunkOut(s.stream_id, torch.zeros(0), True, detail)

    def _release(self, s: StreamState, reason: EndReason) -> None:
        with self._lock:
            self.scheduler.remove(s.stream_id)
        self.runner.detach(s)
        s.phase, s.end_reason = Phase.ENDED, reason
        self.counters.ended[reason.value] += 1
