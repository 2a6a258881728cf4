"""Prometheus metrics of the Code2Wav runtime, and how they reach the supervisor's /metrics.

vLLM-Omni runs stage 2 (Code2Wav) in its own process, so the runtime's metrics are written in
prometheus-client's multiprocess mode: the supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` for the
server (``<run dir>/metrics``, on the pod's ``/tmp`` emptyDir, emptied at every start), every
process that records a metric writes memory-mapped value files there, and the supervisor's
``/metrics`` merges them with a :class:`prometheus_client.multiprocess.MultiProcessCollector`
(:func:`multiprocess_registry`). vLLM keeps its own metrics in the same directory when the
variable is set, so they appear on the same scrape. Gauges use the ``live*`` modes: the files
of a dead process stop counting.

Names (all prefixed ``minicpm_speech_``):

=============================================  =========  ====================================
``reference_preparations_total{outcome,detail}``  counter  one per request at chunk 0 or end
``reference_inline_preparations_total``          counter  inline preparations run
``code2wav_setup_solves_total{mode}``           counter  initial CFM solves, batched/scalar
``code2wav_setup_streams_total{mode}``          counter  streams set up by those solves, or
                                                           ``copied`` from the setup cache or a
                                                           same-voice solve (no solve of their own)
``code2wav_graph_captures_total{kind}``         counter  CUDA graphs captured
``code2wav_graph_replays_total{kind}``          counter  graph replays
``code2wav_graph_refusals_total{kind}``         counter  replays refused (shape/budget)
``code2wav_eager_fallbacks_total{kind}``        counter  steps run eagerly instead
``code2wav_graph_budget_used``                  gauge    graphs held (livemax)
``code2wav_graph_budget_limit``                 gauge    the budget, ``cfm_max_graphs``
``code2wav_chunk_duration_seconds{chunk}``      histogram  device time of an engine step;
                                                           ``first`` when it began a stream
``code2wav_forwards_total``                     counter  stage-2 steps (vLLM-Omni forwards)
``code2wav_engine_steps_total{reason}``         counter  engine steps: ``forward`` (one per
                                                           forward with work), ``final_window``
                                                           (to finish a final window > 1 chunk)
``code2wav_active_streams``                     gauge    streams in the engine (livesum)
``code2wav_waiting_streams``                    gauge    streams waiting for a slot (livesum)
``code2wav_slot_wait_seconds``                  histogram  from a stream's setup to its slot
``code2wav_first_audio_seconds``                histogram  from a stream's first codes in
                                                           stage 2 to its first audio
``code2wav_real_time_margin``                   gauge    the worst playing stream's audio
                                                           seconds per wall second since its
                                                           first audio; +Inf when none plays
                                                           (livemin)
``code2wav_real_time_factor``                   gauge    1 / that margin, 0 when none plays
                                                           (livemax): what an autoscaler holds
``gpu_memory_bytes{kind}``                      gauge    torch allocator (livesum)
``gpu_allocator_events{event}``                 gauge    the torch allocator's own counts since
                                                           the process started (livesum):
                                                           ``num_ooms`` (allocations that failed
                                                           even after a retry) and
                                                           ``num_alloc_retries`` (its cache
                                                           flushed to retry one); both stay 0
                                                           in a healthy pod
``code2wav_refused_requests_total{reason}``     counter  requests served no audio because of
                                                           their own input: ``voice`` (refused
                                                           reference), ``tokens`` (a token
                                                           outside the codebook)
``reference_arrivals_total{outcome}``           counter  voices spooled at request arrival:
                                                           ``taken`` to preparation, ``expired``,
                                                           ``bad_file``, ``failed``
``reference_arrival_to_prepared_seconds``       histogram  request arrival to its voice prepared
``reference_arrival_to_first_window_seconds``   histogram  request arrival to stage 2's chunk 0
``requests_in_flight``                          gauge    requests in the API server, arrival
                                                           to last byte (livesum; :mod:`.drain`)
=============================================  =========  ====================================

The supervisor's own, in its own registry (:class:`SupervisorMetrics`): ``ready``,
``server_up``, ``mps_daemon_up``, ``warmup_duration_seconds``, ``warmup_requests_total``,
``draining`` (1 from SIGTERM until the drain ends) and ``drain_abandoned_requests`` (what the
last drain left in flight when its deadline or a second signal ended it; 0 when it ran dry).

``kind`` of the graph families is ``decode``, ``setup``, ``hift`` or ``hift_tail`` (a stream's
last chunk); the batched engine counts
captures, replays and refusals over all kinds together, under ``kind="all"`` (its eager runs
are by kind). The ``scalar`` setup mode and the ``decode`` graph kind of those counters are
kept for dashboards built on vLLM-Omni's own Code2Wav; the engine does not use them.

``outcome`` is one of ``ahead``, ``inline``, ``late``, ``failed``, ``abandoned``; ``detail`` is
voice preparation's finer outcome (:data:`PREP_OUTCOME`): a cached voice is prepared ahead, a
queue-full request is inline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minicpm_speech_contract.pod_metrics import (
    ACTIVE_STREAMS,
    FIRST_AUDIO_SECONDS,
    PREFIX,
    QUEUED_STREAMS,
    REAL_TIME_FACTOR,
    REAL_TIME_MARGIN,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..voice.counters import OUTCOMES
from .realtime import real_time_factor

# voice preparation's outcome -> (outcome, detail)
PREP_OUTCOME: dict[str, tuple[str, str]] = {
    "ahead": ("ahead", "ahead"),
    "cached": ("ahead", "cached"),
    "inline": ("inline", "inline"),
    "queue_full": ("inline", "queue_full"),
    "late": ("late", "late"),
    "failed": ("failed", "failed"),
    "abandoned": ("abandoned", "abandoned"),
}
assert set(PREP_OUTCOME) == set(OUTCOMES)

GRAPH_KINDS = ("decode", "setup", "hift", "hift_tail", "all")
SETUP_MODES = ("batched", "scalar")
COPIED = "copied"  # a setup_streams mode only: such a stream had no solve
CHUNK_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
WAIT_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_REASONS = ("forward", "final_window")
ARRIVAL_OUTCOMES = ("taken", "expired", "bad_file", "failed")
REFUSAL_REASONS = ("voice", "tokens")
# How a Code2Wav stream ended: the engine's end reasons (serving/backend.py names them).
STREAM_ENDS = ("done", "cancelled", "token-out-of-range", "empty", "idle-timeout",
               "prompt-too-long", "fault", "non-finite", "other")
LEAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
FIRST_AUDIO_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)


class RuntimeMetrics:
    """The runtime's metrics; one per process (see :func:`runtime_metrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        p = PREFIX
        self.preparations = Counter(
            f"{p}_reference_preparations", "Reference voices by how chunk 0 got them",
            ["outcome", "detail"], **kw,
        )
        self.inline_runs = Counter(
            f"{p}_reference_inline_preparations", "Inline reference preparations run", **kw
        )
        self.setup_solves = Counter(
            f"{p}_code2wav_setup_solves", "Initial CFM solves of new streams", ["mode"], **kw
        )
        self.setup_streams = Counter(
            f"{p}_code2wav_setup_streams", "Streams set up by initial CFM solves", ["mode"], **kw
        )
        self.graph_captures = Counter(
            f"{p}_code2wav_graph_captures", "CUDA graphs captured", ["kind"], **kw
        )
        self.graph_replays = Counter(
            f"{p}_code2wav_graph_replays", "CUDA graph replays", ["kind"], **kw
        )
        self.graph_refusals = Counter(
            f"{p}_code2wav_graph_refusals", "CUDA graph replays refused", ["kind"], **kw
        )
        self.eager_fallbacks = Counter(
            f"{p}_code2wav_eager_fallbacks", "Steps run eagerly instead of by a graph",
            ["kind"], **kw,
        )
        self.graph_budget_used = Gauge(
            f"{p}_code2wav_graph_budget_used", "CUDA graphs held of the shared budget",
            multiprocess_mode="livemax", **kw,
        )
        self.graph_budget_limit = Gauge(
            f"{p}_code2wav_graph_budget_limit", "CUDA graph budget (cfm_max_graphs)",
            multiprocess_mode="livemax", **kw,
        )
        self.chunk_seconds = Histogram(
            f"{p}_code2wav_chunk_duration_seconds", "Device time of one Code2Wav decode call",
            ["chunk"], buckets=CHUNK_BUCKETS, **kw,
        )
        self.forwards = Counter(
            f"{p}_code2wav_forwards", "Stage-2 steps (vLLM-Omni forwards) planned", **kw
        )
        self.engine_steps = Counter(
            f"{p}_code2wav_engine_steps", "Engine steps, by why they ran", ["reason"], **kw
        )
        # The scaler's metrics are named in the contract, which the operator's autoscaler reads.
        self.active_streams = Gauge(
            ACTIVE_STREAMS, "Code2Wav streams in the engine",
            multiprocess_mode="livesum", **kw,
        )
        self.waiting_streams = Gauge(
            QUEUED_STREAMS, "Code2Wav streams waiting for an engine slot",
            multiprocess_mode="livesum", **kw,
        )
        self.first_audio_seconds = Histogram(
            FIRST_AUDIO_SECONDS,
            "From a stream's first codes in Code2Wav to its first audio",
            buckets=FIRST_AUDIO_BUCKETS, **kw,
        )
        self.real_time_margin = Gauge(
            REAL_TIME_MARGIN,
            "Worst playing stream's audio seconds per wall second since its first audio",
            multiprocess_mode="livemin", **kw,
        )
        self.real_time_factor = Gauge(
            REAL_TIME_FACTOR,
            "Worst playing stream's wall seconds per audio second (1 / margin, 0 when idle)",
            multiprocess_mode="livemax", **kw,
        )
        self.set_real_time_margin(float("inf"))
        self.slot_wait_seconds = Histogram(
            f"{p}_code2wav_slot_wait_seconds", "Time from a stream's setup to its engine slot",
            buckets=WAIT_BUCKETS, **kw,
        )
        self.gpu_memory = Gauge(
            f"{p}_gpu_memory_bytes", "GPU memory of the torch allocator in the Code2Wav process",
            ["kind"], multiprocess_mode="livesum", **kw,
        )
        # The allocator counts these itself; a gauge mirrors its running totals.
        self.allocator_events = Gauge(
            f"{p}_gpu_allocator_events",
            "Torch allocator OOMs and cache-flushing retries in the Code2Wav process",
            ["event"], multiprocess_mode="livesum", **kw,
        )
        self.refused_requests = Counter(
            f"{p}_code2wav_refused_requests", "Requests failed alone by their own input",
            ["reason"], **kw,
        )
        self.streams_ended = Counter(
            f"{p}_code2wav_streams_ended", "Code2Wav streams the engine ended, by why",
            ["reason"], **kw,
        )
        self.arrivals = Counter(
            f"{p}_reference_arrivals", "Reference voices spooled at request arrival",
            ["outcome"], **kw,
        )
        self.arrival_to_prepared = Histogram(
            f"{p}_reference_arrival_to_prepared_seconds",
            "From a request's arrival to its reference voice prepared", buckets=LEAD_BUCKETS,
            **kw,
        )
        self.arrival_to_first_window = Histogram(
            f"{p}_reference_arrival_to_first_window_seconds",
            "From a request's arrival to its first window in stage 2", buckets=LEAD_BUCKETS,
            **kw,
        )
        self._prep_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        # Every label set exists from the start, so a scrape shows zeros, not absences.
        for outcome, detail in PREP_OUTCOME.values():
            self.preparations.labels(outcome, detail)
        for mode in SETUP_MODES:
            self.setup_solves.labels(mode)
            self.setup_streams.labels(mode)
        self.setup_streams.labels(COPIED)
        for kind in GRAPH_KINDS:
            for family in (self.graph_captures, self.graph_replays, self.graph_refusals,
                           self.eager_fallbacks):
                family.labels(kind)
        for chunk in ("first", "steady"):
            self.chunk_seconds.labels(chunk)
        for reason in STEP_REASONS:
            self.engine_steps.labels(reason)
        for outcome in ARRIVAL_OUTCOMES:
            self.arrivals.labels(outcome)
        for reason in REFUSAL_REASONS:
            self.refused_requests.labels(reason)
        for reason in STREAM_ENDS:
            self.streams_ended.labels(reason)

    def record_prep_counters(self, snapshot: Mapping[str, int]) -> None:
        """Add what voice preparation's :class:`PrepCounters` counted since the last call."""
        with self._lock:
            for name, value in snapshot.items():
                delta = value - self._prep_seen.get(name, 0)
                if delta <= 0:
                    continue
                self._prep_seen[name] = value
                if name == "inline_runs":
                    self.inline_runs.inc(delta)
                elif name in PREP_OUTCOME:
                    self.preparations.labels(*PREP_OUTCOME[name]).inc(delta)

    def record_setups(self, solves: int, streams: int, batched: bool, copied: int = 0) -> None:
        mode = "batched" if batched else "scalar"
        if solves:
            self.setup_solves.labels(mode).inc(solves)
        if streams:
            self.setup_streams.labels(mode).inc(streams)
        if copied:
            self.setup_streams.labels(COPIED).inc(copied)

    def graph_event(self, event: str, kind: str, n: int = 1) -> None:
        family = {
            "capture": self.graph_captures,
            "replay": self.graph_replays,
            "refusal": self.graph_refusals,
            "eager": self.eager_fallbacks,
        }[event]
        family.labels(kind).inc(n)

    def set_graph_budget(self, used: int, limit: int) -> None:
        self.graph_budget_used.set(used)
        self.graph_budget_limit.set(limit)

    def observe_chunk(self, seconds: float, first: bool) -> None:
        self.chunk_seconds.labels("first" if first else "steady").observe(seconds)

    def set_active_streams(self, n: int) -> None:
        self.active_streams.set(n)

    def set_waiting_streams(self, n: int) -> None:
        self.waiting_streams.set(n)

    def observe_first_audio(self, seconds: float) -> None:
        self.first_audio_seconds.observe(max(0.0, seconds))

    def set_real_time_margin(self, margin: float) -> None:
        """The worst playing stream's margin (+inf when none plays), and its reciprocal."""
        self.real_time_margin.set(margin)
        self.real_time_factor.set(real_time_factor(margin))

    def observe_slot_wait(self, seconds: float) -> None:
        self.slot_wait_seconds.observe(max(0.0, seconds))

    def stream_ended(self, reason: str) -> None:
        """``reason`` is the engine's (``"done"``, or ``"token-out-of-range: ..."``)."""
        head = reason.split(":", 1)[0].strip()
        self.streams_ended.labels(head if head in STREAM_ENDS else "other").inc()

    def arrival(self, outcome: str) -> None:
        self.arrivals.labels(outcome).inc()

    def observe_arrival_lead(self, to_prepared: float, to_first_window: float) -> None:
        self.arrival_to_prepared.observe(max(0.0, to_prepared))
        self.arrival_to_first_window.observe(max(0.0, to_first_window))

    def set_gpu_memory(self, allocated: int, reserved: int, stats: Mapping[str, int]) -> None:
        """Bytes held, and the allocator's OOM and retry counts from its ``memory_stats``."""
        self.gpu_memory.labels("allocated").set(allocated)
        self.gpu_memory.labels("reserved").set(reserved)
        for event in ALLOCATOR_EVENTS:
            self.allocator_events.labels(event).set(stats.get(event, 0))


ALLOCATOR_EVENTS = ("num_ooms", "num_alloc_retries")
_instance: RuntimeMetrics | None = None
_instance_lock = threading.Lock()


def runtime_metrics() -> RuntimeMetrics:
    """This process's metrics, created once (prometheus-client refuses duplicate names)."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = RuntimeMetrics()
        return _instance


def multiprocess_registry(path: str | Path | None = None) -> CollectorRegistry | None:
    """A registry merging the value files of ``path`` (default: ``$PROMETHEUS_MULTIPROC_DIR``)."""
    directory = str(path) if path is not None else os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not Path(directory).is_dir():
        return None
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry


class SupervisorMetrics:
    """The supervisor's own gauges, in its own registry (never in multiprocess mode)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        p = PREFIX
        kw: dict[str, Any] = {"registry": self.registry}
        self.ready = Gauge(f"{p}_ready", "1 once warm-up and precapture finished", **kw)
        self.server_up = Gauge(f"{p}_server_up", "1 while the server process lives", **kw)
        self.mps_up = Gauge(f"{p}_mps_daemon_up", "1 while the MPS control daemon lives", **kw)
        self.warmup_seconds = Gauge(
            f"{p}_warmup_duration_seconds", "Time from server start to ready", **kw
        )
        self.warmup_requests = Counter(
            f"{p}_warmup_requests", "Warm-up requests by result", ["result"], **kw
        )
        for result in ("ok", "error"):
            self.warmup_requests.labels(result)
        self.draining = Gauge(f"{p}_draining", "1 while the pod drains its streams", **kw)
        self.drain_abandoned = Gauge(
            f"{p}_drain_abandoned_requests",
            "Requests the drain left in flight when its deadline or a second signal ended it",
            **kw,
        )
