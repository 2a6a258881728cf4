"""Stage 2's Code2Wav backend: vLLM-Omni's ``MiniCPMO45Code2Wav`` keeps its request
bookkeeping, this project's batched engine does the work.

vLLM-Omni 0.30.0's model reads five attributes of its backend, :data:`VLLM_OMNI_READS`:
``prepare_prompt(cache_id, wav)``, ``evict_prompt(cache_id, wav)``, ``setup_batch(features,
n)``, ``decode_batch(tokens, features, states, last_chunk=)`` and ``decode_ragged_batch(tokens,
features, states, last_chunks=)``. :class:`Code2WavBackend` offers those and what the plugin
calls: ``submit_ahead``, ``plan_forward``, ``precapture`` and ``close``. Nothing here imports
vLLM-Omni: the plugin injects its ``PromptFeatures`` constructor.

* **One engine step per stage-2 step.** vLLM-Omni splits a forward's requests into batches,
  one per (voice, cache shape, epoch), and calls the backend once per batch: with a voice per
  request, once per request. Before the first of those calls the plugin hands every batch to
  :meth:`Code2WavBackend.plan_forward`, which prepares each batch's voice, opens its new
  streams, pushes every window's tokens and steps the engine once, so every voice of the step
  decodes in one solve; the per-batch calls that follow take their audio from that step. A
  failure met while planning a batch is raised when vLLM-Omni reaches that batch, where its own
  error handling names the batch's requests. The engine steps again only to finish a final
  window longer than one chunk (25 tokens), because vLLM-Omni lets a request go after its last
  window; such steps are counted (``reason="final_window"``).
* **A request's own faults fail it alone.** vLLM-Omni fails a whole forward, every request in
  it, when its backend raises. A reference voice that preparation refuses (silent, say;
  :class:`~minicpm_speech_runtime.voice.wav.BadReference`) or that the engine cannot set up
  (:class:`~minicpm_speech_runtime.engine.VoiceRefused`) therefore does not raise: its
  requests get a :class:`RefusedVoice` and handles that are already finished, so they decode
  no audio, and the forward goes on for everyone else; a token outside the codebook ends its
  own stream in the engine. Each refused request is logged once and counted
  (``code2wav_refused_requests_total{reason}``). Any other failure is raised at its batch.
* **Capacity.** The engine holds ``max_streams`` streams (stage 2's ``max_num_seqs``). A
  request beyond them waits, first come first served, its tokens kept, and starts when a stream
  ends; the queue's depth and each wait are metrics.
* **Windows.** vLLM-Omni's connector (``tts2code2wav_async_chunk``) sends 3 codes of left
  context, then the new tokens. Before a stream's first window that context is three silence
  codes, which vLLM-Omni vocodes as the stream's start, so the first window is pushed whole;
  later windows repeat the previous window's last tokens, which the engine kept, so those are
  skipped. A final window of 25 or more new tokens is cut into the engine's chunks, where
  vLLM-Omni's own path vocodes it in one piece: same length, a different last stretch of audio.
* **Streams.** A "state" vLLM-Omni keeps per request is a :class:`StreamHandle`; when vLLM-Omni
  lets it go (request finished or aborted) its stream is cancelled at the next step.
* **Reference preparation** goes to voice preparation's
  :class:`~minicpm_speech_runtime.voice.prep.VoicePrep`:
  :meth:`Code2WavBackend.submit_ahead` starts it when vLLM-Omni writes a request's reference
  WAV; ``prepare_prompt`` then acquires it. A VoicePrep request is one vLLM-Omni runtime prompt
  (its ``cache_id``); vLLM-Omni calls ``evict_prompt`` when no request holds it, which releases
  it. Without workers, ``inline_prepare`` prepares at chunk 0.
* **From arrival.** The plugin's arrival watcher (:mod:`.arrivals`) runs vLLM-Omni's own
  reference normalisation for a voice spooled when its request arrived, beside the model's
  ``forward`` (the runtime-prompt table they share is locked per operation; see
  :class:`~.prompt_memo.LockedPromptTable`), and notes the arrival (:meth:`note_arrival`);
  chunk 0 then observes how long before it the voice was ready.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from minicpm_speech_contract.extras import Code2WavExtras

from ..engine import Code2WavEngine, EndReason, VoiceRefused
from ..engine.config import CHUNK_TOKENS, LOOKAHEAD_TOKENS, PROMPT_PAD_TOKEN
from ..voice.device import PreparedVoice
from ..voice.prep import VoicePrep
from ..voice.wav import BadReference
from .batched import voice_from_features
from .metrics import RuntimeMetrics
from .prompt_memo import PromptMemo
from .realtime import RealTimeTracker
from .refusals import REFUSED_PROMPT

log = logging.getLogger(__name__)

# What minicpmo_4_5_code2wav.py (vLLM-Omni 0.30.0) reads of ``self.backend``.
VLLM_OMNI_READS = (
    "prepare_prompt",
    "evict_prompt",
    "setup_batch",
    "decode_batch",
    "decode_ragged_batch",
)
MAX_ARRIVALS_NOTED = 4096
CAMPPLUS_BACKENDS = {"cuda": "torch", "onnxruntime": "onnxruntime", "tensorrt": "tensorrt"}


@dataclass(eq=False)
class StreamHandle:
    """vLLM-Omni's per-request "state": the engine stream it stands for."""

    stream_id: int
    windows: int = 0  # windows pushed
    finished: bool = False
    reason: str | None = None
    planned: bool = False  # this forward's window was pushed by ``plan_forward``
    warned: bool = False  # its dropped tokens were logged

    # vLLM-Omni buckets continuing requests by the tensor shapes of their states' caches
    # (``state_shape_signature`` reads these two); a handle's caches live in the engine, so
    # every handle of one prompt and epoch shares one bucket and the engine takes ragged rows.
    flow_cache: ClassVar[Mapping[str, torch.Tensor]] = MappingProxyType({})
    hift_cache: ClassVar[Mapping[str, torch.Tensor]] = MappingProxyType({})


@dataclass(frozen=True)
class RefusedVoice:
    """What ``prepare_prompt`` gives for a voice that cannot be served; vLLM-Omni hands it back
    to ``setup_batch``, which opens finished handles for it."""

    cache_key: tuple[str, str]
    reason: str


REFUSED = "refused-voice"  # the end reason of a refused voice's handles
REQUEST_FAULTS = (BadReference, VoiceRefused)


@dataclass(eq=False)
class _Waiting:
    """A stream that has no engine slot yet, and the tokens it was sent meanwhile."""

    voice: PreparedVoice
    since: float
    tokens: list[int] = field(default_factory=list)
    last: bool = False


class _StepTimer:
    """Device time of engine steps without a host sync: events resolved on later steps."""

    def __init__(self, metrics: RuntimeMetrics, device: torch.device) -> None:
        self.metrics, self.device = metrics, device
        self.pending: list[tuple[Any, Any, bool]] = []

    def start(self) -> Any:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()  # type: ignore[no-untyped-call]
            return event
        return time.perf_counter()

    def stop(self, begin: Any, first: bool) -> None:
        if isinstance(begin, float):
            self.metrics.observe_chunk(time.perf_counter() - begin, first)
            return
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record()  # type: ignore[no-untyped-call]
        self.pending.append((begin, end, first))
        self.poll()

    def poll(self) -> None:
        still = []
        for begin, end, first in self.pending:
            if end.query():
                self.metrics.observe_chunk(begin.elapsed_time(end) / 1000.0, first)
            else:
                still.append((begin, end, first))
        self.pending = still


def _host_rows(rows: Sequence[torch.Tensor]) -> list[list[int]]:
    """Token rows as host lists, in one device-to-host copy: vLLM-Omni's windows are views of
    the step's ``input_ids``, on the device, and a copy per row waits on the device each time."""
    if not rows:
        return []
    flat = [r.reshape(-1) for r in rows]
    values = torch.cat(flat).tolist()
    out, at = [], 0
    for r in flat:
        n = int(r.numel())
        out.append([int(v) for v in values[at : at + n]])
        at += n
    return out


class Code2WavBackend:
    """vLLM-Omni's Code2Wav backend surface on this project's :class:`Code2WavEngine`."""

    def __init__(
        self,
        engine: Code2WavEngine,
        options: Code2WavExtras,
        metrics: RuntimeMetrics,
        device: torch.device,
        make_features: Callable[[tuple[str, str], PreparedVoice], Any],
        inline_prepare: Callable[[str, str], Any],
        prep: VoicePrep | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.options = options
        self.metrics = metrics
        self.device = device
        self.make_features = make_features
        self.inline_prepare = inline_prepare
        self.prep = prep
        self.clock = clock
        # told ``(request id, message)`` of each request served no audio because preparation
        # or the engine refused its voice, so its client gets an error (the plugin records it
        # for the API server; it records the voices vLLM-Omni refused itself)
        self.on_refused: Callable[[str, str], None] | None = None
        self._features: dict[tuple[str, str], Any] = {}
        self._voices: dict[Any, PreparedVoice] = {}
        self._submitted: set[str] = set()
        self._lock = threading.Lock()
        self.model_lock = threading.RLock()
        self._arrived: OrderedDict[str, float] = OrderedDict()  # cache id -> arrival (epoch)
        self.arrival_watcher: Any = None  # set by the plugin; closed with the backend
        self._next_id = 0
        self._dropped: deque[int] = deque()  # appended by handle finalizers
        self._waiting: OrderedDict[int, _Waiting] = OrderedDict()
        self._final: set[int] = set()  # streams whose last window is pushed
        self._unstarted: set[int] = set()  # admitted streams with no audio yet
        self._stash: dict[int, list[torch.Tensor]] = {}  # audio of a stream until collected
        self._ended: dict[int, str] = {}
        self._deferred: dict[tuple[str, str], Exception] = {}  # raised at that batch's call
        self._refused: dict[tuple[str, str], str] = {}  # voices that cannot be served, and why
        self._planned_setups: dict[tuple[str, str], deque[list[StreamHandle]]] = {}
        self._timer = _StepTimer(metrics, device)
        self._real_time = RealTimeTracker()
        self._graph_seen: dict[tuple[str, str], int] = {}
        self._setups_seen = (0, 0, 0)
        # raw references vLLM-Omni normalised, read by the plugin's _materialize_runtime_prompt
        self.prompt_memo = PromptMemo()
        metrics.set_graph_budget(0, options.cfm_max_graphs)

    # ----------------------------------------------------------------- references

    def submit_ahead(self, prompt_cache_id: str, prompt_wav: str) -> bool:
        """Start preparing a request's reference now; False when it is known or not queued."""
        if self.prep is None:
            return False
        with self._lock:
            if prompt_cache_id in self._submitted:
                return False
            self._submitted.add(prompt_cache_id)
        queued = self.prep.submit(prompt_cache_id, Path(prompt_wav).read_bytes())
        self.metrics.record_prep_counters(self.prep.counters.snapshot())
        return queued

    def note_arrival(self, prompt_cache_id: str, arrived_at: float) -> None:
        """A request whose voice is ``prompt_cache_id`` arrived at ``arrived_at`` (epoch s)."""
        with self._lock:
            self._arrived[prompt_cache_id] = arrived_at
            self._arrived.move_to_end(prompt_cache_id)
            while len(self._arrived) > MAX_ARRIVALS_NOTED:
                self._arrived.popitem(last=False)

    def prepare_prompt(self, prompt_cache_id: str, prompt_wav: str) -> Any:
        key = (prompt_cache_id, prompt_wav)
        if prompt_cache_id.startswith(REFUSED_PROMPT):
            return RefusedVoice(key, prompt_cache_id[len(REFUSED_PROMPT):])
        failed = self._deferred.pop(key, None)
        if failed is not None:
            raise failed
        refused = self._refused.get(key)
        if refused is not None:
            return RefusedVoice(key, refused)
        cached = self._features.get(key)
        if cached is not None:
            return cached
        try:
            return self._prepare(key)
        except BadReference as exc:
            return self._refuse(key, exc)

    def _prepare(self, key: tuple[str, str]) -> Any:
        prompt_cache_id, prompt_wav = key
        if self.prep is None:
            features = self.inline_prepare(prompt_cache_id, prompt_wav)
            self.metrics.preparations.labels("inline", "inline").inc()
            self.metrics.inline_runs.inc()
        else:
            with self._lock:
                known = prompt_cache_id in self._submitted
                self._submitted.add(prompt_cache_id)
            data = None if known else Path(prompt_wav).read_bytes()
            try:
                voice = self.prep.acquire(prompt_cache_id, data)
            finally:
                self.metrics.record_prep_counters(self.prep.counters.snapshot())
            features = self.make_features(key, voice)
        self._features[key] = features
        self._observe_arrival(prompt_cache_id)
        return features

    def _observe_arrival(self, prompt_cache_id: str) -> None:
        with self._lock:
            arrived = self._arrived.pop(prompt_cache_id, None)
        if arrived is None:
            return
        now = time.time()
        # prepared ahead: when its job finished; otherwise chunk 0 just prepared it
        ahead = self.prep.prepared_at(prompt_cache_id) if self.prep is not None else None
        self.metrics.observe_arrival_lead(min(now, ahead or now) - arrived, now - arrived)

    def evict_prompt(self, prompt_cache_id: str, prompt_wav: str) -> None:
        key = (prompt_cache_id, prompt_wav)
        features = self._features.pop(key, None)
        self._refused.pop(key, None)
        with self._lock:
            self._arrived.pop(prompt_cache_id, None)
        self._voices.pop(getattr(features, "cache_key", key), None)
        if self.prep is not None:
            with self._lock:
                self._submitted.discard(prompt_cache_id)
            self.prep.release(prompt_cache_id)
            self.metrics.record_prep_counters(self.prep.counters.snapshot())

    # ----------------------------------------------------------------- streams

    def setup_batch(self, features: Any, batch_size: int) -> list[StreamHandle]:
        """``batch_size`` new streams of the voice in ``features``; their setup runs in the
        engine's next step, batched across voices. A voice the engine cannot set up is
        refused here (ValueError)."""
        key = getattr(features, "cache_key", None)
        planned = self._planned_setups.get(key) if isinstance(key, tuple) else None
        if planned and len(planned[0]) == batch_size:
            return planned.popleft()
        if isinstance(features, RefusedVoice):
            return self._refused_handles(features, batch_size)
        voice = self._voice(features)
        try:
            self.engine.check_voice(voice)
        except VoiceRefused as exc:
            if not isinstance(key, tuple):
                raise
            return self._refused_handles(self._refuse(key, exc), batch_size)
        handles = [self._open(voice) for _ in range(batch_size)]
        self._admit()
        return handles

    def _refuse(self, key: tuple[str, str], exc: Exception) -> RefusedVoice:
        reason = str(exc)[:300]
        if key not in self._refused:
            log.warning("Code2Wav voice %s refused; its requests get no audio: %s",
                        key[0][:100], reason)
        self._refused[key] = reason
        return RefusedVoice(key, reason)

    def _refused_handles(self, refused: RefusedVoice, n: int) -> list[StreamHandle]:
        with self._lock:
            first = self._next_id
            self._next_id += n
        self.metrics.refused_requests.labels("voice").inc(n)
        return [StreamHandle(first + i, finished=True, reason=REFUSED) for i in range(n)]

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

    def plan_forward(self, batches: Iterable[Sequence[Any]]) -> None:
        """Every decode batch of one vLLM-Omni forward (its ``_WorkItem`` lists), before
        vLLM-Omni calls the backend for the first: push them all, then step the engine once."""
        self._cancel_dropped()
        self._deferred.clear()
        self._planned_setups.clear()
        handles: list[StreamHandle] = []
        rows: list[torch.Tensor] = []
        lasts: list[bool] = []
        for batch in batches:
            head = batch[0]
            key = (head.prompt_cache_id, head.prompt_wav)
            try:
                features = self.prepare_prompt(*key)
                if head.previous is None:
                    opened = self.setup_batch(features, len(batch))
                    self._planned_setups.setdefault(key, deque()).append(opened)
                    self._tell_refused(batch, opened)
                else:
                    opened = [item.previous.token2wav for item in batch]
            except Exception as exc:  # vLLM-Omni meets it at this batch, and names its requests
                self._deferred[key] = exc
                continue
            handles += opened
            rows += [item.tokens for item in batch]
            lasts += [item.last_chunk for item in batch]
        for handle, ids, last in zip(handles, _host_rows(rows), lasts, strict=True):
            self._push(handle, ids, last)
            handle.planned = True
        self.metrics.forwards.inc()
        self._run(handles)

    def _tell_refused(self, batch: Sequence[Any], opened: list[StreamHandle]) -> None:
        if self.on_refused is None:
            return
        for item, handle in zip(batch, opened, strict=True):
            key = (item.prompt_cache_id, item.prompt_wav)
            if handle.reason == REFUSED and key in self._refused:
                self.on_refused(str(item.state_id), self._refused[key])

    # ----------------------------------------------------------------- start-up and stats

    def precapture(self, prompt_cache_id: str, prompt_wav: str) -> dict[str, Any]:
        """The engine's warm-up (its graph grid), then one short stream of the model's default
        reference, so no graph is captured while serving."""
        begin = time.perf_counter()
        features = self.prepare_prompt(prompt_cache_id, prompt_wav)
        captured = self.engine.warmup()
        states = self.setup_batch(features, 1)
        silence = torch.full((2 * CHUNK_TOKENS,), PROMPT_PAD_TOKEN, dtype=torch.long)
        self._decode([silence], states, [True])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._timer.poll()
        self._export()
        stats = self.engine.graph_stats()
        return {
            "state": "done",
            "seconds": round(time.perf_counter() - begin, 3),
            "captured": captured,
            "graphs": int(stats.get("graphs", 0)),
            "graph_stats": stats,
        }

    def close(self) -> None:
        if self.arrival_watcher is not None:
            self.arrival_watcher.close()
        if self.prep is not None:
            self.prep.close()

    @property
    def waiting_streams(self) -> int:
        return len(self._waiting)

    # ----------------------------------------------------------------- internals

    def _voice(self, features: Any) -> PreparedVoice:
        key = getattr(features, "cache_key", None)
        voice = self._voices.get(key) if key is not None else None
        if voice is None:
            voice = voice_from_features(features, self.device)
            if key is not None:
                self._voices[key] = voice
        return voice

    def _open(self, voice: PreparedVoice) -> StreamHandle:
        with self._lock:
            sid = self._next_id
            self._next_id += 1
        handle = StreamHandle(sid)
        # Never call into the engine from a finalizer (it may run inside a step).
        weakref.finalize(handle, self._dropped.append, sid)
        self._waiting[sid] = _Waiting(voice, self.clock())
        self._real_time.opened(sid, self.clock())
        return handle

    def _admit(self) -> None:
        """Start waiting streams, oldest first, while the engine has room for the oldest."""
        while self._waiting and self.engine.admits(next(iter(self._waiting.values())).voice):
            sid, w = self._waiting.popitem(last=False)
            self.engine.add_stream(sid, w.voice)
            self._unstarted.add(sid)
            if w.tokens or w.last:
                self.engine.push_tokens(sid, w.tokens, last=w.last)
            self.metrics.observe_slot_wait(self.clock() - w.since)
        self.metrics.set_waiting_streams(len(self._waiting))

    def _cancel_dropped(self) -> None:
        while self._dropped:
            sid = self._dropped.popleft()
            self._real_time.ended(sid)
            for table in (self._stash, self._ended):
                table.pop(sid, None)
            self._final.discard(sid)
            self._unstarted.discard(sid)
            if self._waiting.pop(sid, None) is None:
                self.engine.cancel(sid)

    def _push(self, handle: StreamHandle, ids: list[int], last: bool) -> None:
        if handle.windows:
            ids = ids[LOOKAHEAD_TOKENS:]
        handle.windows += 1
        sid = handle.stream_id
        if last:
            self._final.add(sid)
        waiting = self._waiting.get(sid)
        if waiting is not None:
            waiting.tokens += ids
            waiting.last = waiting.last or last
            return
        if handle.finished or sid in self._ended:
            reason = handle.reason or self._ended.get(sid)
            if ids and reason not in ("done", REFUSED) and not handle.warned:
                handle.warned = True
                log.warning("Code2Wav stream %s ended (%s); %d tokens of it are dropped",
                            sid, reason, len(ids))
            return
        self.engine.push_tokens(sid, ids, last=last)

    def _decode(
        self, rows: list[torch.Tensor], states: list[Any], lasts: list[bool]
    ) -> tuple[list[torch.Tensor], list[Any]]:
        self._cancel_dropped()
        handles: list[StreamHandle] = list(states)
        unplanned = [i for i, h in enumerate(handles) if not h.planned]
        pushed = _host_rows([rows[i] for i in unplanned])
        for i, ids in zip(unplanned, pushed, strict=True):
            self._push(handles[i], ids, lasts[i])
        for handle in handles:
            handle.planned = False
        unplanned_handles = [handles[i] for i in unplanned]
        if unplanned_handles:
            self._run(unplanned_handles)
        return self._collect(handles), handles

    def _run(self, handles: list[StreamHandle]) -> None:
        """One step when any of ``handles`` has output; more only while a stream whose last
        window came has some left (its request ends with this forward)."""
        self._admit()
        if any(self.engine.has_output(h.stream_id) for h in handles):
            self._step("forward")
        while True:
            self._admit()
            left = [h.stream_id for h in handles if h.stream_id in self._final]
            if not any(sid in self._waiting or self.engine.has_output(sid) for sid in left):
                break
            if not self._step("final_window"):
                stuck = [sid for sid in left if sid in self._waiting]
                log.warning("Code2Wav streams %s ended waiting for a slot; their audio is lost",
                            stuck)
                for sid in stuck:
                    self._waiting.pop(sid)
                    self._ended[sid] = "no-slot"
                    self._real_time.ended(sid)
                break

    def _step(self, reason: str) -> bool:
        """One engine step; False when it had nothing to do."""
        begin = self._timer.start()
        outs = self.engine.step()
        first = False
        now = self.clock()
        for out in outs:
            sid = out.stream_id
            if out.pcm.numel():
                self._stash.setdefault(sid, []).append(out.pcm)
                if sid in self._unstarted:
                    self._unstarted.discard(sid)
                    first = True
                latency = self._real_time.produced(sid, out.pcm.numel(), now)
                if latency is not None:
                    self.metrics.observe_first_audio(latency)
            if out.finished:
                self._real_time.ended(sid)
                self._ended[sid] = out.reason or "done"
                self.metrics.stream_ended(out.reason or "done")
                if (out.reason or "").startswith(EndReason.BAD_TOKEN.value):
                    self.metrics.refused_requests.labels("tokens").inc()
                self._final.discard(sid)
                self._unstarted.discard(sid)
        self._timer.stop(begin, first)
        self.metrics.engine_steps.labels(reason).inc()
        self._export()
        return bool(outs)

    def _collect(self, handles: list[StreamHandle]) -> list[torch.Tensor]:
        audios = []
        for h in handles:
            parts = self._stash.pop(h.stream_id, [])
            audios.append(torch.cat(parts) if parts else torch.zeros(0))
            reason = self._ended.pop(h.stream_id, None)
            if reason is not None:
                h.finished, h.reason = True, reason
        return audios

    def _export(self) -> None:
        self.metrics.set_active_streams(self.engine.num_streams)
        self.metrics.set_real_time_margin(self._real_time.worst_margin(self.clock()))
        if self.device.type == "cuda":
            self.metrics.set_gpu_memory(
                torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device),
                torch.cuda.memory_stats(self.device),
            )
        c = self.engine.counters
        now = (c.setup_groups, c.setups, c.setup_shared + c.setup_hits)
        if now != self._setups_seen:
            solves, streams, copied = (
                max(0, a - b) for a, b in zip(now, self._setups_seen, strict=True)
            )
            self._setups_seen = now
            self.metrics.record_setups(solves, streams, batched=True, copied=copied)
        raw = self.engine.graph_stats()
        counts = {
            ("capture", "all"): int(raw.get("captures", 0)),
            ("replay", "all"): int(raw.get("replays", 0)),
            ("refusal", "all"): int(raw.get("refusals", 0)),
            **{("eager", str(kind)): int(n) for kind, n in dict(raw.get("eager", {})).items()},
        }
        for (event, kind), value in counts.items():
            delta = value - self._graph_seen.get((event, kind), 0)
            if delta > 0:
                self._graph_seen[(event, kind)] = value
                self.metrics.graph_event(event, kind, delta)
        budget = int(raw.get("budget", self.options.cfm_max_graphs))
        self.metrics.set_graph_budget(int(raw.get("graphs", 0)), budget)
