"""The setup cache's LRU: byte budget, voice bound, refusal of what cannot fit."""

from __future__ import annotations

import torch
from minicpm_speech_runtime.engine.encoder import EncoderState
from minicpm_speech_runtime.engine.setup_cache import SetupCache, VoiceSetup


def _entry(frames: int) -> VoiceSetup:
    """An entry of ``frames`` prompt frames; 4 bytes per number, 100 numbers per frame."""
    k = torch.zeros(frames, 50)
    empty = torch.zeros(0)
    return VoiceSetup(k, k.clone(), empty, EncoderState(empty, empty, 0, False))


def test_byte_budget_evicts_least_recently_used() -> None:
    cache = SetupCache(budget_bytes=3 * 400 * 10)  # room for 30 frames
    for key in ("a", "b", "c"):
        assert cache.put(key, _entry(10))
    assert cache.get("a") is not None  # a is now the most recent
    assert cache.put("d", _entry(10))
    assert list(cache.entries) == ["c", "a", "d"] and cache.evictions == 1
    assert cache.nbytes <= cache.budget


def test_voice_bound_and_refusals() -> None:
    cache = SetupCache(budget_bytes=10**8, max_entries=2)
    for key in ("a", "b", "c"):
        cache.put(key, _entry(1))
    assert list(cache.entries) == ["b", "c"]
    assert not cache.put("big", _entry(10**6))  # larger than the whole budget: not kept
    assert "big" not in cache and len(cache) == 2
    off = SetupCache(budget_bytes=10**9, max_entries=0)
    assert not off.enabled and not off.put("a", _entry(1)) and len(off) == 0
    assert cache.get("zzz") is None and cache.misses == 1
