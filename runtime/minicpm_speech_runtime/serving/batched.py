"""This project's batched Code2Wav engine behind vLLM-Omni's ``BatchedToken2Wav`` surface.

:class:`EngineBackend` implements :class:`~.backend.Code2WavEngine` (the protocol of setup,
decode and evict that :class:`~.backend.RuntimeBackend` drives) on
:class:`minicpm_speech_runtime.engine.Code2WavEngine`:

* ``setup_batch(features, n)`` adds ``n`` engine streams of the voice in ``features`` and returns
  one :class:`StreamHandle` per stream; the engine's cold setup runs at the next step, grouped
  by ``micro_batch`` across voices (one batched solve per group).
* ``decode_batch`` / ``decode_ragged_batch`` push each row's new tokens and step the engine
  until none of those streams has a chunk ready; each row's PCM is the concatenation of its
  chunks. vLLM-Omni's connector (``tts2code2wav_async_chunk``) sends a window of
  ``LOOKAHEAD_TOKENS`` codes of left context and then the new tokens: before a stream's first
  window that context is three silence codes, which vLLM-Omni vocodes as the stream's start,
  so the first window is pushed whole; later windows repeat the previous window's last
  tokens, which the engine kept, so those are skipped. Non-final windows carry 25 new tokens
  (one engine chunk); a final window with 25 or more new tokens (a Talker that hands over
  several tokens with its finish) is cut into the engine's 25-token chunks, where vLLM-Omni's
  own path vocodes it in one piece: same length, a different last stretch of audio.
* Any other attribute vLLM-Omni reads of its backend comes from its own ``BatchedToken2Wav``
  (``fallback``), which is built but no longer driven.
* Handles are returned unchanged as the "next states"; when vLLM-Omni lets a handle go (request
  finished or aborted) its stream is cancelled at the next step.

:func:`engine_config` maps the connector extras onto :class:`EngineConfig` and refuses what
the engine cannot do, with one line naming the key.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from ..device import PreparedVoice
from ..engine import Code2WavEngine, EngineConfig
from ..engine.config import CHUNK_TOKENS, LOOKAHEAD_TOKENS, PROMPT_PAD_TOKEN
from .config import ENGINE_CHUNK_TOKENS, ENGINE_LOOKAHEAD_TOKENS, batched_engine_refusal

assert (ENGINE_CHUNK_TOKENS, ENGINE_LOOKAHEAD_TOKENS) == (CHUNK_TOKENS, LOOKAHEAD_TOKENS)

log = logging.getLogger(__name__)

DEFAULT_MAX_STREAMS = 8
PROMPT_FRAMES_PER_SECOND = 50  # 25 Hz tokens, 2 mel frames each
# vLLM-Omni ends its requests itself (``on_requests_finished`` drops the state, whose handle
# then cancels the stream), so the engine's idle timeout only backstops a state never let go.
# At the engine's default of 30 s it cut live requests whose next window was merely slow to
# come (a loaded stage 1), and their audio ended early without an error.
IDLE_BACKSTOP_S = 600.0


class UnsupportedOption(ValueError):
    """A connector extra the batched engine cannot honour; the message is one line."""


def engine_config(
    extras: Mapping[str, Any], device: torch.device, max_streams: int | None = None
) -> EngineConfig:
    """The :class:`EngineConfig` of a stage's connector extras; raises :class:`UnsupportedOption`.

    ``micro_batch_size`` -> ``micro_batch``, ``cfm_max_graphs`` -> ``graph_budget``,
    ``cfm_graph_precapture`` -> ``precapture``, ``token2wav_allow_tf32`` -> ``tf32``,
    ``enable_cfm_graph`` -> ``cuda_graphs`` (CUDA only), ``enable_hift_graph`` ->
    ``vocoder_graphs`` (default on), ``token2wav_setup_cache_size`` -> ``setup_cache_voices``
    (0 turns the engine's setup cache off), ``token2wav_n_timesteps`` ->
    ``n_timesteps``, ``ref_audio_max_seconds`` -> ``max_prompt_frames``. ``max_streams`` is the
    stage's concurrency (at least ``micro_batch_size``; default 8).
    """
    refusal = batched_engine_refusal({**extras, "batched_code2wav": True})
    if refusal is not None:
        raise UnsupportedOption(refusal)
    micro = int(extras.get("micro_batch_size", 4))
    budget = int(extras.get("cfm_max_graphs", 32))
    steps = int(extras.get("token2wav_n_timesteps", 10))
    frames = 500
    if extras.get("ref_audio_max_seconds") is not None:
        seconds = float(extras["ref_audio_max_seconds"])
        frames = int(-(-seconds * PROMPT_FRAMES_PER_SECOND // 1))
        frames = max(2, frames + frames % 2)
    streams = max(micro, max_streams if max_streams is not None else DEFAULT_MAX_STREAMS)
    return EngineConfig(
        max_streams=streams,
        max_prompt_frames=frames,
        micro_batch=micro,
        n_timesteps=steps,
        tf32=bool(extras.get("token2wav_allow_tf32", False)),
        cuda_graphs=device.type == "cuda" and bool(extras.get("enable_cfm_graph", True)),
        precapture=bool(extras.get("cfm_graph_precapture", False)),
        vocoder_graphs=bool(extras.get("enable_hift_graph", True)),
        setup_cache_voices=_optional_int(extras.get("token2wav_setup_cache_size")),
        graph_budget=budget,
        idle_timeout_s=IDLE_BACKSTOP_S,
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def voice_from_features(features: Any, device: torch.device) -> PreparedVoice:
    """A :class:`PreparedVoice` of vLLM-Omni's ``PromptFeatures`` (or a voice, returned as is)."""
    if isinstance(features, PreparedVoice):
        return features
    tokens = features.speech_tokens.reshape(1, -1).to(device=device, dtype=torch.long)
    mels = features.mels
    if mels.dim() == 2:
        mels = mels.unsqueeze(0)
    mels = mels.to(device=device, dtype=torch.float32)
    spk = features.speaker_embedding.reshape(1, -1).to(device=device, dtype=torch.float32)
    return PreparedVoice(
        key=repr(getattr(features, "cache_key", id(features))),
        prompt_tokens=tokens,
        prompt_tokens_len=torch.tensor([tokens.shape[1]], dtype=torch.int32, device=device),
        spk_emb=spk,
        prompt_mels=mels,
        prompt_mels_len=torch.tensor([mels.shape[1]], dtype=torch.int32, device=device),
    )


@dataclass(eq=False)
class StreamHandle:
    """vLLM-Omni's per-request "state": the engine stream it stands for."""

    stream_id: int
    windows: int = 0  # decode calls seen
    finished: bool = False
    reason: str | None = None

    # vLLM-Omni buckets continuing requests by the tensor shapes of their states' caches
    # (``state_shape_signature`` reads these two); a handle's caches live in the engine, so
    # every handle of one prompt and epoch shares one bucket and the engine takes ragged rows.
    flow_cache: ClassVar[Mapping[str, torch.Tensor]] = MappingProxyType({})
    hift_cache: ClassVar[Mapping[str, torch.Tensor]] = MappingProxyType({})


class EngineBackend:
    """:class:`~.backend.Code2WavEngine` on this project's batched engine."""

    batches_references = True  # setup solves are batched across voices by the engine
    counts_setups = True  # RuntimeBackend reads setups from ``setup_counters``

    def __init__(
        self, engine: Code2WavEngine, device: torch.device, fallback: Any = None
    ) -> None:
        self.engine = engine
        self.device = device
        self.fallback = fallback  # vLLM-Omni's backend: other attributes it reads come from it
        self._voices: dict[Any, PreparedVoice] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self._dropped: collections.deque[int] = collections.deque()  # appended by finalizers
        self._stash: dict[int, list[torch.Tensor]] = {}  # PCM of a stream outside its call
        self._ended: dict[int, str] = {}

    # --------------------------------------------------------------- protocol

    def setup_batch(self, features: Any, batch_size: int) -> list[StreamHandle]:
        voice = self._voice(features)
        handles = []
        for _ in range(batch_size):
            with self._lock:
                sid = self._next_id
                self._next_id += 1
            self.engine.add_stream(sid, voice)
            handle = StreamHandle(sid)
            # Never call into the engine from a finalizer (it may run inside a step).
            weakref.finalize(handle, self._dropped.append, sid)
            handles.append(handle)
        return handles

    def decode_batch(
        self, tokens: torch.Tensor, features: Any, states: list[Any], *, last_chunk: bool,
        **_: Any,
    ) -> tuple[list[torch.Tensor], list[Any]]:
        if int(tokens.shape[0]) != len(states):
            raise ValueError(f"tokens batch {int(tokens.shape[0])} != state batch {len(states)}")
        rows = [tokens[i] for i in range(len(states))]
        return self._decode(rows, states, [last_chunk] * len(states))

    def decode_ragged_batch(
        self, tokens: list[torch.Tensor], features: Any, states: list[Any], *,
        last_chunks: list[bool],
    ) -> tuple[list[torch.Tensor], list[Any]]:
        if not len(tokens) == len(states) == len(last_chunks):
            raise ValueError("ragged token, state, and final-flag batches must have the same size")
        return self._decode(list(tokens), states, list(last_chunks))

    def evict_prompt(self, prompt_cache_id: str, prompt_wav: str) -> None:
        self._voices.pop((prompt_cache_id, prompt_wav), None)
        evict = getattr(self.fallback, "evict_prompt", None)
        if callable(evict):  # its own prompt cache (inline preparation) lets go too
            evict(prompt_cache_id, prompt_wav)

    # --------------------------------------------------------------- start-up and stats

    def precapture(self, features: Any, batch_sizes: Sequence[int]) -> dict[str, Any]:
        """The engine's warm-up (its graph grid), then one short stream of ``features``."""
        captured = self.engine.warmup()
        states = self.setup_batch(features, 1)
        silence = torch.full((2 * CHUNK_TOKENS,), PROMPT_PAD_TOKEN, dtype=torch.long)
        self._decode([silence], states, [True])
        return {"captured": captured, "graph_stats": self.graph_stats()}

    def graph_stats(self) -> dict[str, Any]:
        return self.engine.graph_stats()

    def setup_counters(self) -> tuple[int, int, int]:
        """(batched setup solves, streams they set up, streams copied from the setup cache or
        from a same-voice stream's solve) so far."""
        c = self.engine.counters
        return c.setup_groups, c.setups, c.setup_shared + c.setup_hits

    @property
    def num_streams(self) -> int:
        return self.engine.num_streams

    def __getattr__(self, name: str) -> Any:
        fallback = self.__dict__.get("fallback")
        if fallback is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(fallback, name)

    # --------------------------------------------------------------- internals

    def _voice(self, features: Any) -> PreparedVoice:
        key = getattr(features, "cache_key", None)
        voice = self._voices.get(key) if key is not None else None
        if voice is None:
            voice = voice_from_features(features, self.device)
            if key is not None:
                self._voices[key] = voice
        return voice

    def _cancel_dropped(self) -> None:
        while self._dropped:
            sid = self._dropped.popleft()
            self._stash.pop(sid, None)
            self._ended.pop(sid, None)
            self.engine.cancel(sid)

    def _pending(self, sid: int) -> bool:
        s = self.engine.scheduler.streams.get(sid)
        return s is not None and (s.ready_chunk() is not None or s.end_reason is not None)

    def _decode(
        self, rows: list[torch.Tensor], states: list[Any], lasts: list[bool]
    ) -> tuple[list[torch.Tensor], list[Any]]:
        self._cancel_dropped()
        handles: list[StreamHandle] = list(states)
        for handle, row, last in zip(handles, rows, lasts, strict=True):
            ids = [int(t) for t in row.reshape(-1).tolist()]
            if handle.windows:
                ids = ids[LOOKAHEAD_TOKENS:]
            handle.windows += 1
            if handle.finished or handle.stream_id not in self.engine.scheduler.streams:
                reason = handle.reason or self._ended.get(handle.stream_id)
                if ids and reason != "done":
                    log.warning("Code2Wav stream %s ended (%s); %d tokens of it are dropped",
                                handle.stream_id, reason, len(ids))
                continue
            self.engine.push_tokens(handle.stream_id, ids, last=last)
        wanted = {h.stream_id for h in handles}
        for _ in range(1 << 16):
            if not any(self._pending(sid) for sid in wanted):
                break
            for out in self.engine.step():
                sid = out.stream_id
                if out.pcm.numel():
                    self._stash.setdefault(sid, []).append(out.pcm)
                if out.finished:
                    self._ended[sid] = out.reason or "done"
        audios = []
        for h in handles:
            parts = self._stash.pop(h.stream_id, [])
            audios.append(torch.cat(parts) if parts else torch.zeros(0))
            if h.stream_id in self._ended:
                h.finished, h.reason = True, self._ended.pop(h.stream_id)
        return audios, handles
