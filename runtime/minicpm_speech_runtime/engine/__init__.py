"""Batched streaming Code2Wav engine: many streams, each with its own voice, on one device.

Public API::

    engine = Code2WavEngine(models, EngineConfig(max_streams=32, micro_batch=8))
    engine.warmup()                               # precapture the CUDA graph grid
    engine.add_stream(sid, prepared_voice)        # PreparedVoice from voice preparation
    engine.push_tokens(sid, tokens, last=False)   # any number of tokens; ids 0..6560
    for out in engine.step():                     # one batched step for every ready stream
        out.stream_id, out.pcm, out.finished, out.reason
    engine.cancel(sid)                            # ends at the next step boundary
    engine.counters                               # steps, chunks, setups, ended reasons
    engine.graph_stats()                          # captures (after warm-up), replays, eager

Chunking is the reference's streaming contract: a chunk is 25 tokens plus 3 lookahead tokens
(kept for the next chunk); the last chunk is whatever remains, decoded with ``last_chunk``.
Each step ends streams that must end (cancel, a token outside the codebook, ``last`` with no
tokens at all, idle timeout), runs the cold setup of new voices in groups of at most
``micro_batch``, and decodes one chunk per ready stream in one batched 10-step CFG solve and
one vocoder call per distinct mel length. Per-stream PCM equals the reference's
``Token2wav.stream`` (tests/runtime/test_engine_parity.py).

Layout: ``state`` (per-stream host state, cache frame map), ``scheduler`` (CPU only, no torch),
``estimator`` (batched DiT with in-place caches), ``kernels`` / ``triton_kernels`` (its norms,
attention, conv taps and HiFT's Snake as Triton kernels on CUDA, torch ops elsewhere),
``vocoder`` (batched HiFT), ``encoder`` (batched conformer), ``setup_cache`` (set-up voices),
``transfer`` (uploads and downloads that never stall the host), ``runner`` (owns device
buffers, slots and the graph dispatcher), ``graphs`` (which CUDA graphs exist, budget,
counters), ``engine`` (the step).
"""

from .config import EngineConfig
from .engine import ChunkOut, Code2WavEngine, EngineCounters, VoiceRefused
from .state import EndReason

__all__ = ["ChunkOut", "Code2WavEngine", "EndReason", "EngineConfig", "EngineCounters",
           "VoiceRefused"]
