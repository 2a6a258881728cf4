"""What the operator says stays short and says what happened: capped status and events that
never echo a huge value whole, a refused update that says it was refused, and one log line
per reconcile decision."""

from __future__ import annotations

import asyncio
import logging

import pytest
from minicpm_speech_operator.diffbase import DIFFBASE_KEY
from minicpm_speech_operator.errors import MESSAGE_LIMIT, InvalidSpec
from minicpm_speech_operator.manifests import GROUP

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import (
    NAME,
    condition,
    create_and_settle,
    events,
    example_spec,
    mark_rolled_out,
    settled,
)

EXTRA = "spec.profileOverrides.connectors.connector_of_shared_memory.extra"


def huge_override(size: int) -> dict[str, object]:
    return {"connectors": {"connector_of_shared_memory": {"extra": {
        "campplus_backend": "x" * size}}}}


def test_invalid_spec_keeps_field_and_fix_whole_and_caps_the_rest() -> None:
    error = InvalidSpec("spec.a", "bad value " + "y" * 100_000, "Set it to 1.")
    text = str(error)
    assert len(text) <= MESSAGE_LIMIT
    assert text.startswith("spec.a: bad value yyy") and text.endswith(". Set it to 1.")
    assert "more characters" in text


async def test_a_huge_value_is_never_echoed_whole(cluster: Cluster, operator: Operator) -> None:
    cluster.api.create_speech(NAME, {**example_spec(), "profileOverrides": huge_override(200_000)})
    speech = await cluster.wait_for(settled(cluster))
    degraded = condition(speech, "Degraded")
    assert degraded["reason"] == "InvalidSpec" and degraded["message"].startswith(
        f"{EXTRA}.campplus_backend")
    assert len(degraded["message"]) <= MESSAGE_LIMIT
    await cluster.wait_for(lambda: any(e.get("type") == "Warning" for e in events(cluster)),
                           message="a Warning event")
    assert all(len(e.get("message", "")) <= MESSAGE_LIMIT for e in events(cluster))


async def test_a_spec_over_the_annotation_limit_is_handled_once(
        cluster: Cluster, operator: Operator, caplog: pytest.LogCaptureFixture) -> None:
    """Kopf remembers the last handled spec in an annotation, and the API server bounds an
    object's annotations at 256 KiB: a 600 KB spec is refused in status once, and what Kopf
    stores is a digest, not a copy that the server would refuse after every run."""
    caplog.set_level(logging.INFO, logger="kopf.objects")
    cluster.api.create_speech(NAME, {**example_spec(), "profileOverrides": huge_override(600_000)})
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and s["metadata"].get("annotations", {}).get(
            f"{GROUP}/{DIFFBASE_KEY}") and s, message="Kopf's record of the handled spec")
    assert condition(speech, "Degraded")["reason"] == "InvalidSpec"
    assert len(speech["metadata"]["annotations"][f"{GROUP}/{DIFFBASE_KEY}"]) < 100
    await asyncio.sleep(3)  # Kopf retries a failed store after 1 s, then 1 s, 2 s...
    said = [r.getMessage() for r in caplog.records if f"/{NAME}]" in r.getMessage()
            or getattr(r, "k8s_ref", {}).get("name") == NAME]
    assert not [line for line in said if "Throttling" in line or "Unprocessable" in line]
    assert sum("Creation is processed" in line for line in said) == 1


async def test_a_refused_update_says_so_while_the_old_config_serves(
    cluster: Cluster, operator: Operator
) -> None:
    if not cluster.is_emulated:
        pytest.skip("on a real cluster, readiness waits for a real GPU pod's warm-up")
    await create_and_settle(cluster)
    await mark_rolled_out(cluster)
    await cluster.wait_for(lambda: (s := cluster.api.get_speech(NAME))
                           and s["status"]["phase"] == "Ready")
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "turbo"}}})

    def phase_event() -> dict[str, object] | None:
        return next((e for e in events(cluster) if e.get("reason") == "PhaseDegraded"), None)

    event = await cluster.wait_for(phase_event, message="the PhaseDegraded event")
    assert event["type"] == "Warning"
    message = str(event["message"])
    assert message.startswith("InvalidSpec: the new spec was refused and nothing changed")
    assert "serving" in message  # and what still runs


async def test_each_reconcile_decision_is_one_log_line(
        cluster: Cluster, operator: Operator, caplog: pytest.LogCaptureFixture) -> None:
    # The log records themselves: Kopf's runner captures stdout by swapping a global, which
    # another thread's output can race.
    caplog.set_level(logging.INFO, logger="minicpm_speech_operator.reconciler")
    await create_and_settle(cluster)
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "turbo"}}})
    await cluster.wait_for(lambda: (s := settled(cluster)()) and s["status"]["phase"]
                           == "Degraded")
    lines = [record.getMessage() for record in caplog.records
             if record.name == "minicpm_speech_operator.reconciler"
             and f"resource={cluster.namespace}/{NAME}" in record.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    created = next(line for line in lines if "result=ok" in line and "created=" in line)
    assert f"created=Deployment/{NAME}" in created and "unchanged=" in created
    refused = next(line for line in lines if "result=invalid" in line)
    assert "reason=InvalidSpec" in refused and "spec.profile.name" in refused
