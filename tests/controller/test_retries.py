"""How soon a failed reconcile is tried again, and how often its failure is reported."""

from __future__ import annotations

import random

import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from minicpm_speech_operator import retries
from minicpm_speech_operator.leader import LeaseConfig


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_overload_and_server_errors_are_transient(status: int) -> None:
    assert retries.is_transient(ApiException(status=status))


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_refusal_of_the_request_itself_is_not(status: int) -> None:
    assert not retries.is_transient(ApiException(status=status))


def test_timeouts_resets_and_a_stale_lease_are_transient() -> None:
    assert retries.is_transient(urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"))
    assert retries.is_transient(ConnectionResetError())
    assert retries.is_transient(retries.NotLeading("stale"))
    assert not retries.is_transient(KeyError("bug"))


def test_a_vanished_or_changed_object_is_a_race_not_a_failure() -> None:
    assert retries.is_race(ApiException(status=404)) and retries.is_race(ApiException(status=409))
    assert not retries.is_race(ApiException(status=500))


def test_delays_start_under_a_second_grow_and_are_capped_with_jitter() -> None:
    rng = random.Random(5)
    first = [retries.delay_s(0, rng) for _ in range(200)]
    assert min(first) >= 0.25 and max(first) <= 0.5
    assert len({round(d, 3) for d in first}) > 100  # jittered: failures do not retry in step
    assert all(1.0 <= retries.delay_s(2, rng) <= 2.0 for _ in range(50))
    assert all(15.0 <= retries.delay_s(n, rng) <= 30.0 for n in (6, 10, 1000))


def test_a_resource_failing_at_every_retry_posts_one_warning_a_minute() -> None:
    now = [0.0]
    events = retries.FailureEvents(interval_s=60.0, clock=lambda: now[0])
    posted = []
    for second in range(0, 180, 2):
        now[0] = float(second)
        posted.append(events.should_post("ns", "a", "ApiUnavailable"))
    assert sum(posted) == 3
    assert events.should_post("ns", "b", "ApiUnavailable")  # another resource: its own
    assert events.should_post("ns", "a", "ReconcileFailed")  # another reason: its own


def test_lease_durations_must_nest() -> None:
    LeaseConfig("ns", "lease", "me", 15, 10, 2)
    for bad in ((15, 15, 2), (15, 10, 10), (15, 10, 0)):
        with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
            LeaseConfig("ns", "lease", "me", *bad)
