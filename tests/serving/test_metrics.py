"""Runtime metrics: written by another process in multiprocess mode, scraped from the
supervisor's /metrics over HTTP, parsed with prometheus-client's parser."""

from __future__ import annotations

from typing import Any

from minicpm_speech_runtime.engine import EndReason
from minicpm_speech_runtime.serving.metrics import PREP_OUTCOME, STREAM_ENDS, RuntimeMetrics
from minicpm_speech_runtime.voice.counters import OUTCOMES
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Pod, get

EXPECTED = {
    "minicpm_speech_reference_preparations": "counter",
    "minicpm_speech_reference_inline_preparations": "counter",
    "minicpm_speech_code2wav_setup_solves": "counter",
    "minicpm_speech_code2wav_setup_streams": "counter",
    "minicpm_speech_code2wav_graph_captures": "counter",
    "minicpm_speech_code2wav_graph_replays": "counter",
    "minicpm_speech_code2wav_graph_refusals": "counter",
    "minicpm_speech_code2wav_eager_fallbacks": "counter",
    "minicpm_speech_code2wav_graph_budget_used": "gauge",
    "minicpm_speech_code2wav_graph_budget_limit": "gauge",
    "minicpm_speech_code2wav_chunk_duration_seconds": "histogram",
    "minicpm_speech_code2wav_active_streams": "gauge",
    "minicpm_speech_code2wav_forwards": "counter",
    "minicpm_speech_code2wav_engine_steps": "counter",
    "minicpm_speech_code2wav_waiting_streams": "gauge",
    "minicpm_speech_code2wav_slot_wait_seconds": "histogram",
    # what an autoscaler and a dashboard read (minicpm_speech_contract.pod_metrics)
    "minicpm_speech_code2wav_first_audio_seconds": "histogram",
    "minicpm_speech_code2wav_real_time_margin": "gauge",
    "minicpm_speech_code2wav_real_time_factor": "gauge",
    "minicpm_speech_code2wav_streams_ended": "counter",
    "minicpm_speech_gpu_memory_bytes": "gauge",
    "minicpm_speech_gpu_allocator_events": "gauge",
    # the supervisor's own
    "minicpm_speech_ready": "gauge",
    "minicpm_speech_server_up": "gauge",
    "minicpm_speech_mps_daemon_up": "gauge",
    "minicpm_speech_warmup_duration_seconds": "gauge",
    "minicpm_speech_warmup_requests": "counter",
}


def _sample(families: dict[str, Any], name: str, sample: str, **labels: str) -> float:
    for s in families[name].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise KeyError((name, sample, labels))


def test_every_part1_outcome_is_mapped() -> None:
    assert set(PREP_OUTCOME) == set(OUTCOMES)
    assert {o for o, _ in PREP_OUTCOME.values()} == {
        "ahead", "inline", "late", "failed", "abandoned"}


def test_every_engine_end_reason_has_its_own_label() -> None:
    assert {r.value for r in EndReason} == set(STREAM_ENDS) - {"other"}
    registry = CollectorRegistry()
    m = RuntimeMetrics(registry)
    for reason in ("done", "done", "token-out-of-range: 9000 at 3", "refused-voice"):
        m.stream_ended(reason)
    ended = "minicpm_speech_code2wav_streams_ended_total"
    assert registry.get_sample_value(ended, {"reason": "done"}) == 2
    assert registry.get_sample_value(ended, {"reason": "token-out-of-range"}) == 1
    assert registry.get_sample_value(ended, {"reason": "other"}) == 1
    assert registry.get_sample_value(ended, {"reason": "cancelled"}) == 0


def test_prep_counters_are_exported_as_deltas() -> None:
    registry = CollectorRegistry()
    m = RuntimeMetrics(registry)
    m.record_prep_counters({"ahead": 2, "cached": 1, "inline_runs": 1})
    m.record_prep_counters({"ahead": 3, "cached": 1, "queue_full": 2, "inline_runs": 3})
    get_value = registry.get_sample_value
    assert get_value("minicpm_speech_reference_preparations_total",
                     {"outcome": "ahead", "detail": "ahead"}) == 3
    assert get_value("minicpm_speech_reference_preparations_total",
                     {"outcome": "ahead", "detail": "cached"}) == 1
    assert get_value("minicpm_speech_reference_preparations_total",
                     {"outcome": "inline", "detail": "queue_full"}) == 2
    assert get_value("minicpm_speech_reference_inline_preparations_total") == 3


def test_metrics_from_the_server_process_reach_the_supervisor(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_METRICS="1")
    run.wait_ready()
    code, body = get(run.url("/metrics"))
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    for name, kind in EXPECTED.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
    for name, f in families.items():
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), name
    prep = "minicpm_speech_reference_preparations"
    assert _sample(families, prep, f"{prep}_total", outcome="ahead", detail="ahead") == 3
    assert _sample(families, prep, f"{prep}_total", outcome="ahead", detail="cached") == 1
    assert _sample(families, prep, f"{prep}_total", outcome="abandoned") == 1
    solves = "minicpm_speech_code2wav_setup_solves"
    assert _sample(families, solves, f"{solves}_total", mode="batched") == 1
    streams = "minicpm_speech_code2wav_setup_streams"
    assert _sample(families, streams, f"{streams}_total", mode="copied") == 2
    steps = "minicpm_speech_code2wav_engine_steps"
    assert _sample(families, steps, f"{steps}_total", reason="forward") == 3
    assert _sample(families, steps, f"{steps}_total", reason="final_window") == 1
    assert _sample(families, "minicpm_speech_code2wav_forwards",
                   "minicpm_speech_code2wav_forwards_total") == 3
    assert _sample(families, "minicpm_speech_code2wav_waiting_streams",
                   "minicpm_speech_code2wav_waiting_streams") == 1
    wait = "minicpm_speech_code2wav_slot_wait_seconds"
    assert _sample(families, wait, f"{wait}_bucket", le="0.25") == 1
    assert _sample(families, "minicpm_speech_code2wav_graph_captures",
                   "minicpm_speech_code2wav_graph_captures_total", kind="decode") == 5
    assert _sample(families, "minicpm_speech_code2wav_graph_budget_used",
                   "minicpm_speech_code2wav_graph_budget_used") == 5
    chunk = "minicpm_speech_code2wav_chunk_duration_seconds"
    assert _sample(families, chunk, f"{chunk}_count", chunk="first") == 1
    assert _sample(families, chunk, f"{chunk}_bucket", chunk="steady", le="0.005") == 1
    assert _sample(families, "minicpm_speech_code2wav_active_streams",
                   "minicpm_speech_code2wav_active_streams") == 4
    assert _sample(families, "minicpm_speech_gpu_memory_bytes",
                   "minicpm_speech_gpu_memory_bytes", kind="reserved") == 2 << 30
    events = "minicpm_speech_gpu_allocator_events"
    assert _sample(families, events, events, event="num_ooms") == 0
    assert _sample(families, events, events, event="num_alloc_retries") == 2
    first = "minicpm_speech_code2wav_first_audio_seconds"
    assert _sample(families, first, f"{first}_bucket", le="0.1") == 1
    assert _sample(families, "minicpm_speech_code2wav_real_time_margin",
                   "minicpm_speech_code2wav_real_time_margin") == 1.25
    assert _sample(families, "minicpm_speech_code2wav_real_time_factor",
                   "minicpm_speech_code2wav_real_time_factor") == 0.8
    assert _sample(families, "minicpm_speech_ready", "minicpm_speech_ready") == 1
    assert _sample(families, "minicpm_speech_warmup_requests",
                   "minicpm_speech_warmup_requests_total", result="ok") == 3
    run.terminate()
    assert run.wait_exit() == 0
