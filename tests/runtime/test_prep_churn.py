"""Thousands of requests with distinct voices and random cancellation stay bounded."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import random
import tracemalloc

import torch
from minicpm_speech_runtime.voice.device import STAGING, PreparedVoice
from minicpm_speech_runtime.voice.host import HostFeatures
from minicpm_speech_runtime.voice.prep import PrepConfig, VoicePrep

N_REQUESTS = 3000
CACHE = 64


class TinyDevice:
    """A device half with the real one's interface, sized so churn runs in seconds."""

    device = torch.device("cpu")

    def run(self, host: HostFeatures) -> PreparedVoice:
        t = torch.zeros(1, host.n_tokens, dtype=torch.int64)
        n = torch.tensor([host.n_tokens], dtype=torch.int32)
        return PreparedVoice(host.key, t, n, torch.zeros(1, 192), host.prompt_mel, n)


def tiny_host(data: bytes) -> HostFeatures:
    if data.startswith(b"bad"):
        from minicpm_speech_runtime.voice.wav import BadReference

        raise BadReference("corrupt", "test input")
    key = hashlib.sha256(data).hexdigest()
    n = 4
    return HostFeatures(
        key,
        torch.zeros(1, 128, 16),
        torch.tensor([16], dtype=torch.int32),
        torch.zeros(1, 10, 80),
        torch.zeros(1, 2 * n, 80),
        2 * n,
        n,
    )


def _round(prep: VoicePrep, rng: random.Random, start: int, count: int) -> None:
    live: list[str] = []
    for i in range(start, start + count):
        rid = f"req{i}"
        data = b"bad" if rng.random() < 0.02 else f"voice-{i}-{rng.random()}".encode()
        prep.submit(rid, data)
        live.append(rid)
        while len(live) > 24:
            victim = live.pop(rng.randrange(len(live)))
            roll = rng.random()
            if roll < 0.3:
                prep.cancel(victim)  # before chunk 0, in whatever state its job is
                continue
            with contextlib.suppress(Exception):
                prep.acquire(victim, None)
            (prep.cancel if roll < 0.5 else prep.release)(victim)
    for rid in live:
        prep.cancel(rid)
    prep.wait_idle()


def test_churn_stays_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prep = VoicePrep(
        TinyDevice(),  # type: ignore[arg-type]
        PrepConfig(workers=4, queue_size=16, cache_size=CACHE, spool_dir=tmp_path / "spool"),
        tiny_host,
    )
    rng = random.Random(0)
    try:
        _round(prep, rng, 0, N_REQUESTS // 3)  # fills the cache
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _round(prep, rng, N_REQUESTS // 3, 2 * N_REQUESTS // 3)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert prep.live_spool_files() == []
        assert prep.pins() == {}
        assert prep.pending_jobs() == 0
        assert len(prep.cache_keys()) <= CACHE
        assert STAGING.live == 0
        assert grown < 2_000_000, f"retained {grown} bytes after the cache filled"
        assert prep.counters.total_outcomes() == N_REQUESTS
    finally:
        prep.close()
