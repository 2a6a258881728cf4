"""Per-stream host state: token buffer, phase, and the estimator cache's frame bookkeeping.

No torch here. Device caches live in the runner, addressed by the stream's slot; this module
keeps what decides each step's work and where each frame goes in the slot's cache.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .config import CHUNK_TOKENS, CODEBOOK_SIZE, HISTORY_FRAMES, LOOKAHEAD_TOKENS


class Phase(enum.Enum):
    NEW = "new"  # waiting for its cold setup
    LIVE = "live"  # set up; decodes a chunk whenever one is ready
    ENDED = "ended"


class EndReason(enum.StrEnum):
    DONE = "done"
    CANCELLED = "cancelled"
    BAD_TOKEN = "token-out-of-range"
    EMPTY = "empty"
    IDLE_TIMEOUT = "idle-timeout"
    PROMPT_TOO_LONG = "prompt-too-long"
    FAULT = "fault"
    NON_FINITE = "non-finite"  # its audio held NaN or Inf: the stream ends, the batch goes on


@dataclass(slots=True)
class Chunk:
    """Tokens of one decode step of one stream (lookahead included unless ``last``)."""

    tokens: list[int]
    last: bool


@dataclass(slots=True)
class FrameMap:
    """The estimator cache of one slot as the reference orders it.

    The reference prepends each chunk's frames to its cache and, once the cache is longer than
    prompt + 100 frames, keeps the first ``prompt`` and the last 100 entries. Attention over the
    cache is order-free (no positions in the DiT), so only which frames survive matters: this
    map keeps the reference's logical order as physical positions and hands freed positions to
    the next chunk, so every write is in place.
    """

    prompt_frames: int
    capacity: int  # usable positions; the slot's last physical position is the trash frame
    logical: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)

    def setup(self) -> list[int]:
        self.logical = list(range(self.prompt_frames))
        self.free = list(range(self.prompt_frames, self.capacity))
        return self.logical

    def append_chunk(self, frames: int) -> list[int]:
        """Positions for a new chunk's frames (which become the newest cache entries)."""
        new, self.free = self.free[:frames], self.free[frames:]
        if len(new) != frames:
            raise RuntimeError("estimator cache slot overflow")
        self.logical = new + self.logical
        return new

    def truncate(self) -> None:
        limit = self.prompt_frames + HISTORY_FRAMES
        if len(self.logical) > limit:
            dropped = self.logical[self.prompt_frames : len(self.logical) - HISTORY_FRAMES]
            self.logical = self.logical[: self.prompt_frames] + self.logical[-HISTORY_FRAMES:]
            self.free = dropped + self.free

    @property
    def length(self) -> int:
        return len(self.logical)


@dataclass(slots=True)
class StreamState:
    """Everything the scheduler knows of one stream."""

    stream_id: Any
    voice: Any  # the prepared voice (device tensors); opaque here
    voice_key: str
    prompt_frames: int
    order: int  # arrival order; setup groups and outputs keep it
    last_push: float
    phase: Phase = Phase.NEW
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    got_last: bool = False
    chunks_done: int = 0
    end_reason: EndReason | None = None
    end_detail: str = ""

    def push(self, tokens: list[int], last: bool, now: float) -> EndReason | None:
        """Buffer tokens; returns a reason if they end the stream."""
        self.last_push = now
        bad = [t for t in tokens if not 0 <= int(t) < CODEBOOK_SIZE]
        if bad:
            self.end_detail = f"token {bad[0]} outside 0..{CODEBOOK_SIZE - 1}"
            return EndReason.BAD_TOKEN
        self.tokens.extend(int(t) for t in tokens)
        self.got_last = self.got_last or last
        if self.got_last and not self.tokens:
            return EndReason.EMPTY if self.chunks_done == 0 else EndReason.DONE
        return None

    def ready_chunk(self) -> Chunk | None:
        """The next chunk if its tokens are all here: 25 and 3 of lookahead, or, once the last
        token came, a remainder of at most that many as the last chunk. (A remainder of exactly
        25 + 3 is one chunk: nothing follows that its lookahead would serve, and a final window
        of one chunk then takes one step.)"""
        n = len(self.tokens)
        if self.got_last and 0 < n <= CHUNK_TOKENS + LOOKAHEAD_TOKENS:
            return Chunk(list(self.tokens), True)
        if n >= CHUNK_TOKENS + LOOKAHEAD_TOKENS:
            return Chunk(self.tokens[: CHUNK_TOKENS + LOOKAHEAD_TOKENS], False)
        return None

    def consume(self, chunk: Chunk) -> None:
        self.tokens = [] if chunk.last else self.tokens[CHUNK_TOKENS:]
        self.chunks_done += 1
