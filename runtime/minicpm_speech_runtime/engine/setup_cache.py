"""Set-up voices kept on the device, least recently used first out, within a byte budget.

A cold setup (the prompt's encoder pass and its 10-step solve) depends on nothing but the voice:
the CFM noise it starts from is the same fixed tensor for every stream. So its result can be
copied to any later stream of that voice, which then starts with no solve at all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from .encoder import EncoderState


@dataclass(slots=True)
class VoiceSetup:
    """One voice's caches right after its setup (prompt positions only)."""

    k: torch.Tensor  # [steps, depth, 2 rows x prompt frames, heads, head_dim]: pool frames
    v: torch.Tensor
    conv: torch.Tensor  # [steps, depth, 2 rows, 2, 2 * hidden]
    encoder: EncoderState  # the stream's encoder caches, copied

    @property
    def nbytes(self) -> int:
        parts = (self.k, self.v, self.conv, self.encoder.att, self.encoder.cnn)
        return sum(t.numel() * t.element_size() for t in parts)


class SetupCache:
    """At most ``budget_bytes`` of entries and, when given, at most ``max_entries`` of them."""

    def __init__(self, budget_bytes: int, max_entries: int | None = None) -> None:
        self.budget, self.max_entries = budget_bytes, max_entries
        self.entries: OrderedDict[str, VoiceSetup] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0 and self.max_entries != 0

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def get(self, key: str) -> VoiceSetup | None:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, entry: VoiceSetup) -> bool:
        """Keep ``entry``, evicting the least recently used; False if it alone is too big."""
        size = entry.nbytes
        if not self.enabled or size > self.budget:
            return False
        self.entries.pop(key, None)
        used, limit = self.nbytes, self.max_entries
        while self.entries and (
            used + size > self.budget or (limit is not None and len(self.entries) >= limit)
        ):
            _, old = self.entries.popitem(last=False)
            used -= old.nbytes
            self.evictions += 1
        self.entries[key] = entry
        return True

    def discard(self, key: str) -> bool:
        """Drop the voice's entry, if held; whether one was."""
        return self.entries.pop(key, None) is not None

    def clear(self) -> None:
        self.entries.clear()
