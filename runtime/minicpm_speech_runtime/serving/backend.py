"""The Code2Wav backend that the plugin puts behind vLLM-Omni's stage 2.

vLLM-Omni's ``MiniCPMO45Code2Wav`` (``minicpmo_4_5_code2wav.py``) keeps its request
bookkeeping and calls five methods of ``self.backend`` (a ``BatchedToken2Wav``):
``prepare_prompt(cache_id, wav)``, ``evict_prompt(cache_id, wav)``,
``setup_batch(features, n)``, ``decode_batch(tokens, features, states, last_chunk=)`` and
``decode_ragged_batch(tokens, features, states, last_chunks=)``. :class:`RuntimeBackend`
offers the same five and splits them:

* reference preparation goes to part 1's :class:`~minicpm_speech_runtime.prep.VoicePrep`:
  :meth:`RuntimeBackend.submit_ahead` is called (by the plugin) when vLLM-Omni writes a
  request's reference WAV, which happens while parsing the whole step's batch and before the
  first ``prepare_prompt`` of that step, so the host halves of all new voices of a step run on
  the worker threads while earlier buckets decode; ``prepare_prompt`` then ``acquire``\\ s.
  A VoicePrep "request" is one vLLM-Omni runtime prompt (its ``cache_id``); vLLM-Omni tracks
  the owning requests and calls ``evict_prompt`` when none is left, which ``release``\\ s it.
* setup and decode go to a :class:`Code2WavEngine`: with ``batched_code2wav`` the plugin
  puts this project's batched engine there (:class:`~.batched.EngineBackend`, which adds
  ``precapture``, ``graph_stats`` and ``setup_counters``); any object with vLLM-Omni's
  ``BatchedToken2Wav`` surface works too (its CFM wrapper's graph stats are read).

Every call is counted in :class:`~.metrics.RuntimeMetrics`. Nothing here imports
vLLM-Omni: the plugin injects its ``PromptFeatures`` constructor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ..prep import VoicePrep
from .metrics import RuntimeMetrics

log = logging.getLogger(__name__)

CAMPPLUS_BACKENDS = {"cuda": "torch", "onnxruntime": "onnxruntime", "tensorrt": "tensorrt"}


@runtime_checkable
class Code2WavEngine(Protocol):
    """Setup and decode of Code2Wav streams (vLLM-Omni's ``BatchedToken2Wav`` surface)."""

    def setup_batch(self, features: Any, batch_size: int) -> list[Any]: ...

    def decode_batch(
        self, tokens: torch.Tensor, features: Any, states: list[Any], *, last_chunk: bool
    ) -> tuple[list[torch.Tensor], list[Any]]: ...

    def decode_ragged_batch(
        self, tokens: list[torch.Tensor], features: Any, states: list[Any], *,
        last_chunks: list[bool],
    ) -> tuple[list[torch.Tensor], list[Any]]: ...

    def evict_prompt(self, prompt_cache_id: str, prompt_wav: str) -> None: ...


@dataclass(frozen=True)
class RuntimeOptions:
    """The Code2Wav connector extras this runtime reads (profiles/schema.json)."""

    batched_code2wav: bool = False
    micro_batch_size: int = 4
    setup_graph_batch_sizes: tuple[int, ...] = (1,)
    cfm_graph_precapture: bool = False
    cfm_max_graphs: int = 32
    reference_prep_workers: int = 2
    reference_cache_size: int = 16
    campplus_backend: str = "cuda"
    codec_chunk_frames: int = 25
    codec_left_context_frames: int = 3

    @classmethod
    def from_extras(cls, extras: dict[str, Any]) -> RuntimeOptions:
        return cls(
            batched_code2wav=bool(extras.get("batched_code2wav", False)),
            micro_batch_size=int(extras.get("micro_batch_size", 4)),
            setup_graph_batch_sizes=tuple(
                int(s) for s in extras.get("setup_graph_batch_sizes", (1,))
            ),
            cfm_graph_precapture=bool(extras.get("cfm_graph_precapture", False)),
            cfm_max_graphs=int(extras.get("cfm_max_graphs", 32)),
            reference_prep_workers=int(extras.get("reference_prep_workers", 2)),
            reference_cache_size=int(extras.get("reference_cache_size", 16)),
            campplus_backend=str(extras.get("campplus_backend", "cuda")),
            codec_chunk_frames=int(extras.get("codec_chunk_frames", 25)),
            codec_left_context_frames=int(extras.get("codec_left_context_frames", 3)),
        )

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class _ChunkTimer:
    """Device time of decode calls without a host sync: events resolved on later calls."""

    def __init__(self, metrics: RuntimeMetrics) -> None:
        self.metrics = metrics
        self.pending: list[tuple[Any, Any, bool]] = []

    def start(self, device: torch.device) -> Any:
        if device.type == "cuda":
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


class RuntimeBackend:
    def __init__(
        self,
        engine: Code2WavEngine,
        options: RuntimeOptions,
        prep: VoicePrep | None,
        make_features: Callable[[tuple[str, str], Any], Any],
        inline_prepare: Callable[[str, str], Any],
        metrics: RuntimeMetrics,
        device: torch.device,
        streams: Callable[[], int] = lambda: 0,
    ) -> None:
        self.engine = engine
        self.options = options
        self.prep = prep
        self.make_features = make_features
        self.inline_prepare = inline_prepare
        self.metrics = metrics
        self.device = device
        self.streams = streams
        self._features: dict[tuple[str, str], Any] = {}
        self._submitted: set[str] = set()
        self._fresh: set[int] = set()
        self._lock = threading.Lock()
        self._timer = _ChunkTimer(metrics)
        self._graph_seen: dict[tuple[str, str], int] = {}
        self._setups_seen = (0, 0, 0)
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

    def prepare_prompt(self, prompt_cache_id: str, prompt_wav: str) -> Any:
        key = (prompt_cache_id, prompt_wav)
        cached = self._features.get(key)
        if cached is not None:
            return cached
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
        return features

    def evict_prompt(self, prompt_cache_id: str, prompt_wav: str) -> None:
        self._features.pop((prompt_cache_id, prompt_wav), None)
        if self.prep is not None:
            with self._lock:
                self._submitted.discard(prompt_cache_id)
            self.prep.release(prompt_cache_id)
            self.metrics.record_prep_counters(self.prep.counters.snapshot())
        self.engine.evict_prompt(prompt_cache_id, prompt_wav)

    # ----------------------------------------------------------------- streams

    def setup_batch(self, features: Any, batch_size: int) -> list[Any]:
        states = self.engine.setup_batch(features, batch_size)
        if not callable(getattr(self.engine, "setup_counters", None)):
            # vLLM-Omni's engine repeats one prompt: one solve per reference, so "scalar".
            batched = bool(getattr(self.engine, "batches_references", False))
            self.metrics.setup_solve(batch_size, batched)
        self._fresh.update(id(s) for s in states)
        return states

    def _first(self, states: Sequence[Any]) -> bool:
        first = any(id(s) in self._fresh for s in states)
        for s in states:
            self._fresh.discard(id(s))
        return first

    def decode_batch(
        self, tokens: torch.Tensor, features: Any, states: list[Any], *, last_chunk: bool,
        **kwargs: Any,
    ) -> tuple[list[torch.Tensor], list[Any]]:
        first = self._first(states)
        begin = self._timer.start(self.device)
        out = self.engine.decode_batch(tokens, features, states, last_chunk=last_chunk, **kwargs)
        self._timer.stop(begin, first)
        self._after_step()
        return out

    def decode_ragged_batch(
        self, tokens: list[torch.Tensor], features: Any, states: list[Any], *,
        last_chunks: list[bool],
    ) -> tuple[list[torch.Tensor], list[Any]]:
        first = self._first(states)
        begin = self._timer.start(self.device)
        out = self.engine.decode_ragged_batch(tokens, features, states, last_chunks=last_chunks)
        self._timer.stop(begin, first)
        self._after_step()
        return out

    def _after_step(self) -> None:
        self.metrics.set_active_streams(self.streams())
        if self.device.type == "cuda":
            self.metrics.set_gpu_memory(
                torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)
            )
        self.export_setups()
        self.export_graph_stats()

    def export_setups(self) -> None:
        """Setup solves an engine with ``setup_counters()`` ran (it sets up inside its steps)."""
        counters = getattr(self.engine, "setup_counters", None)
        if not callable(counters):
            return
        now = tuple(counters())
        seen = self._setups_seen
        if now != seen:
            self._setups_seen = now
            solves, streams, copied = (max(0, a - b) for a, b in zip(now, seen, strict=True))
            self.metrics.record_setups(solves, streams, batched=True, copied=copied)

    def graph_counts(self) -> tuple[dict[tuple[str, str], int], int, int] | None:
        """((event, kind) -> count so far, graphs held, budget) of the engine, if it has any."""
        own = getattr(self.engine, "graph_stats", None)
        if callable(own):
            raw = own()
            counts = {
                ("capture", "all"): int(raw.get("captures", 0)),
                ("replay", "all"): int(raw.get("replays", 0)),
                ("refusal", "all"): int(raw.get("refusals", 0)),
            }
            for kind, n in dict(raw.get("eager", {})).items():
                counts[("eager", str(kind))] = int(n)
            return counts, int(raw.get("graphs", 0)), int(raw.get("budget",
                                                                  self.options.cfm_max_graphs))
        wrapper = getattr(self.engine, "_cfm_graph_wrapper", None)
        snapshot = getattr(wrapper, "stats_snapshot", None)
        if not callable(snapshot):
            return None
        raw = snapshot()
        # vLLM-Omni flushes its graph cache when the budget is full: a refusal.
        counts = {
            ("capture", "decode"): int(raw.get("captures", 0)),
            ("replay", "decode"): int(raw.get("hits", 0)),
            ("refusal", "decode"): int(raw.get("flushes", 0)),
            ("eager", "decode"): int(raw.get("eager", 0)),
        }
        return counts, int(raw.get("cache_size", 0)), self.options.cfm_max_graphs

    def export_graph_stats(self) -> None:
        """Graph counters of the engine: ``graph_stats()``, or vLLM-Omni's CFM wrapper stats."""
        got = self.graph_counts()
        if got is None:
            return
        counts, used, limit = got
        for (event, kind), value in counts.items():
            delta = value - self._graph_seen.get((event, kind), 0)
            if delta > 0:
                self._graph_seen[(event, kind)] = value
                self.metrics.graph_event(event, kind, delta)
        self.metrics.set_graph_budget(used, limit)

    # ----------------------------------------------------------------- start-up

    def precapture(self, prompt_cache_id: str, prompt_wav: str) -> dict[str, Any]:
        """Run the serving shapes once from a real reference so no graph is captured later.

        An engine with its own ``precapture(features, batch_sizes)`` does it its way; else
        each batch size of ``setup_graph_batch_sizes`` and ``micro_batch_size`` is set up
        and decoded twice (first and steady chunk), which captures vLLM-Omni's lazy CFM
        graphs of those shapes.
        """
        begin = time.perf_counter()
        features = self.prepare_prompt(prompt_cache_id, prompt_wav)
        sizes = sorted({*self.options.setup_graph_batch_sizes, self.options.micro_batch_size})
        own = getattr(self.engine, "precapture", None)
        report: Any = None
        if callable(own):
            report = own(features, sizes)
        else:
            width = self.options.codec_left_context_frames + self.options.codec_chunk_frames
            for size in sizes:
                states = self.setup_batch(features, size)
                tokens = torch.zeros((size, width), dtype=torch.long, device=self.device)
                for _ in range(2):
                    _, states = self.decode_batch(tokens, features, states, last_chunk=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._timer.poll()
        self._after_step()
        document: dict[str, Any] = {
            "state": "done",
            "seconds": round(time.perf_counter() - begin, 3),
            "batch_sizes": sizes,
            "graphs": sum(n for (event, _), n in self._graph_seen.items() if event == "capture"),
        }
        stats = getattr(self.engine, "graph_stats", None)
        if callable(stats):
            document["graph_stats"] = stats()
        if isinstance(report, dict) and "captured" in report:
            document["captured"] = report["captured"]
        return document

    def close(self) -> None:
        if self.prep is not None:
            self.prep.close()

    def __getattr__(self, name: str) -> Any:
        # Anything else vLLM-Omni reads of its backend comes from the engine.
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)
