"""The pod's real-time margin and time to first audio: what an autoscaler and a dashboard read."""

from __future__ import annotations

import math
from typing import Any

import torch
from minicpm_speech_contract import pod_metrics
from minicpm_speech_runtime.serving.metrics import RuntimeMetrics
from minicpm_speech_runtime.serving.realtime import AUDIO_RATE, RealTimeTracker, real_time_factor
from prometheus_client import CollectorRegistry

from .test_batched import features_of, make_backend, setup, utterance, windows

__all__ = ["setup"]  # the fixture, shared with the backend's own tests


def test_a_stream_falls_below_one_when_its_listener_catches_up() -> None:
    tracker = RealTimeTracker()
    tracker.opened(1, now=10.0)
    assert tracker.worst_margin(10.0) == math.inf  # no audio yet: nothing plays
    # times in quarters of a second: exact in binary, so the figures compare exactly
    assert tracker.produced(1, AUDIO_RATE, now=10.25) == 0.25  # time to first audio
    assert tracker.produced(1, AUDIO_RATE, now=10.75) is None  # only the first counts
    assert tracker.worst_margin(11.25) == 2.0  # 2 s of audio in the 1 s since it began
    assert tracker.worst_margin(13.25) == 2 / 3  # stalled: the listener hears a gap
    tracker.ended(1)
    assert tracker.worst_margin(13.25) == math.inf


def test_the_worst_stream_decides() -> None:
    tracker = RealTimeTracker()
    for sid in (1, 2):
        tracker.opened(sid, now=0.0)
        tracker.produced(sid, AUDIO_RATE * sid, now=1.0)
    assert tracker.worst_margin(2.0) == 1.0
    tracker.produced(99, AUDIO_RATE, now=2.0)  # a stream it never saw opened: ignored
    assert tracker.worst_margin(2.0) == 1.0


def test_the_factor_rises_with_load_and_is_zero_when_idle() -> None:
    assert real_time_factor(math.inf) == 0.0
    assert real_time_factor(2.0) == 0.5 and real_time_factor(0.5) == 2.0


def test_the_gauges_start_idle_and_follow_the_margin() -> None:
    registry = CollectorRegistry()
    metrics = RuntimeMetrics(registry)

    def value(name: str) -> float | None:
        return registry.get_sample_value(name)

    assert value(pod_metrics.REAL_TIME_MARGIN) == math.inf
    assert value(pod_metrics.REAL_TIME_FACTOR) == 0.0
    metrics.set_real_time_margin(1.25)
    assert value(pod_metrics.REAL_TIME_FACTOR) == 0.8
    metrics.observe_first_audio(0.09)
    assert value(f"{pod_metrics.FIRST_AUDIO_SECONDS}_count") == 1
    assert registry.get_sample_value(f"{pod_metrics.FIRST_AUDIO_SECONDS}_bucket",
                                     {"le": "0.1"}) == 1


def test_the_backend_reports_each_streams_first_audio_and_the_worst_margin(
        setup: Any) -> None:
    small, voices = setup
    registry = CollectorRegistry()
    backend = make_backend(small, RuntimeMetrics(registry), {"v0": features_of(voices[0], "v0")})
    now = [100.0]
    backend.clock = lambda: now[0]
    feats = backend.prepare_prompt("v0", "/spool/v0.wav")
    states = backend.setup_batch(feats, 2)
    margins = []
    tokens = [windows(utterance(131, 1)), windows(utterance(131, 2))]
    for i in range(len(tokens[0])):
        now[0] += 0.5  # a slow pod: each window of audio takes half a second of wall time
        _, states = backend.decode_batch(
            torch.tensor([tokens[0][i][0], tokens[1][i][0]]), feats, states,
            last_chunk=tokens[0][i][1])
        margins.append(registry.get_sample_value(pod_metrics.REAL_TIME_MARGIN))
    first_audio = f"{pod_metrics.FIRST_AUDIO_SECONDS}_count"
    assert registry.get_sample_value(first_audio) == 2
    assert all(0 < m < math.inf for m in margins[1:-1]), margins
    # Every stream ended: nothing plays, and the autoscaler reads no load.
    assert registry.get_sample_value(pod_metrics.REAL_TIME_MARGIN) == math.inf
    assert registry.get_sample_value(pod_metrics.REAL_TIME_FACTOR) == 0.0
