"""Reference waveforms vLLM-Omni has already normalised, so the same voice is not normalised
twice on stage 2's forward path.

vLLM-Omni's ``_materialize_runtime_prompt(ref_audio, sample_rate)`` folds a reference onto its
24 kHz, fixed-length grid, checks it is finite, hashes it (SHA-256 of the samples) and makes
sure its WAV exists: about 2 ms of a forward's host time per new request. A request whose voice
arrived earlier (:mod:`.arrivals`) has had exactly that done by the arrival watcher; a client
that sends one reference for many requests has it done once per request. The result is a pure
function of the raw samples and the rate (the model's ``ref_audio_max_seconds`` is fixed), so
:class:`PromptMemo` keeps each raw reference it saw with the key vLLM-Omni computed for it, and
a later call with equal samples (compared in full, not by a hash) returns that key. The entry
itself is vLLM-Omni's, looked up in its own table as its own code does; when the table or the
WAV no longer holds it, vLLM-Omni's function runs as usual.

vLLM-Omni's table of runtime prompts (``_runtime_prompts``, an ``OrderedDict``) is read and
changed by stage 2's forward and, since voices are taken at arrival, by the arrival watcher's
thread too. :class:`LockedPromptTable` takes its place so that the watcher can run vLLM-Omni's
normalisation (resampling, hashing, writing the WAV: milliseconds a voice) without holding the
model lock, which a forward would otherwise wait for at the start of a step.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

MAX_ENTRIES = 256
MAX_BYTES = 128 * 2**20  # raw references kept, all together
MAX_ENTRY_BYTES = 16 * 2**20  # a longer reference is not kept
FINGERPRINT_SAMPLES = 256


def raw_reference(ref_audio: Any, sample_rate: Any) -> tuple[torch.Tensor, int] | None:
    """``(samples, rate)`` when the call is one this memo can answer: a 1-D float32 CPU tensor
    and an integral rate. Anything else (lists, stereo, tensors on a device) is left to
    vLLM-Omni."""
    if not isinstance(ref_audio, torch.Tensor) or ref_audio.dim() != 1:
        return None
    if ref_audio.dtype != torch.float32 or ref_audio.device.type != "cpu":
        return None
    if isinstance(sample_rate, torch.Tensor):
        if sample_rate.numel() != 1:
            return None
        sample_rate = sample_rate.item()
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | float):
        return None
    if float(sample_rate) != int(sample_rate) or int(sample_rate) <= 0:
        return None
    return ref_audio, int(sample_rate)


def _fingerprint(samples: torch.Tensor, rate: int) -> tuple[int, int, bytes]:
    n = int(samples.numel())
    stride = max(1, n // FINGERPRINT_SAMPLES)
    return rate, n, samples[::stride].contiguous().numpy().tobytes()


class PromptMemo:
    """Raw reference -> vLLM-Omni's runtime-prompt key, bounded in entries and bytes."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[int, int, bytes], tuple[torch.Tensor, str]] = (
            OrderedDict()
        )
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()  # the forward and the arrival watcher both use it

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, samples: torch.Tensor, rate: int) -> str | None:
        """The key remembered for these exact samples at this rate, or None."""
        fingerprint = _fingerprint(samples, rate)
        with self._lock:
            found = self._entries.get(fingerprint)
            if found is None or not torch.equal(found[0], samples):
                self.misses += 1
                return None
            self._entries.move_to_end(fingerprint)
            self.hits += 1
            return found[1]

    def remember(self, samples: torch.Tensor, rate: int, cache_key: str) -> None:
        size = int(samples.numel()) * samples.element_size()
        if size > MAX_ENTRY_BYTES or size > self.max_bytes:
            return
        fingerprint = _fingerprint(samples, rate)
        # a copy: the caller's tensor may be a view of a buffer that is reused
        kept = samples.detach().clone()
        with self._lock:
            old = self._entries.pop(fingerprint, None)
            if old is not None:
                self._bytes -= int(old[0].numel()) * old[0].element_size()
            self._entries[fingerprint] = (kept, cache_key)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (dropped, _) = self._entries.popitem(last=False)
                self._bytes -= int(dropped.numel()) * dropped.element_size()


class LockedPromptTable(OrderedDict[Any, Any]):
    """vLLM-Omni's runtime-prompt table, safe to share between two threads.

    Every single operation vLLM-Omni performs on the table (``get``, item assignment,
    ``move_to_end``, ``pop``, ``len``, iterating ``items()`` while evicting) holds one lock;
    iteration runs over a snapshot, so an entry added by the other thread never breaks a loop
    that is evicting. A sequence of operations is not atomic: two threads that normalise the
    same new voice at once both write its entry, with the same key, id and WAV path, and the
    second write wins; a voice evicted before the watcher hands it to preparation is prepared
    at its first window instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lock = threading.RLock()
        super().__init__(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        with self.lock:
            return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        with self.lock:
            super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        with self.lock:
            super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        with self.lock:
            return super().__contains__(key)

    def __len__(self) -> int:
        with self.lock:
            return super().__len__()

    def __iter__(self) -> Iterator[Any]:
        with self.lock:
            return iter(list(super().__iter__()))

    def get(self, key: Any, default: Any = None) -> Any:
        with self.lock:
            return super().get(key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        with self.lock:
            return super().pop(key, *default)

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        with self.lock:
            return super().popitem(last=last)

    def move_to_end(self, key: Any, last: bool = True) -> None:
        with self.lock:
            super().move_to_end(key, last=last)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        with self.lock:
            return super().setdefault(key, default)

    def clear(self) -> None:
        with self.lock:
            super().clear()

    def items(self) -> Any:
        with self.lock:
            return list(super().items())

    def keys(self) -> Any:
        with self.lock:
            return list(super().keys())

    def values(self) -> Any:
        with self.lock:
            return list(super().values())
