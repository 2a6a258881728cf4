"""A small Kopf operator runs its whole lifecycle against the emulator."""

from __future__ import annotations

import time

import pytest

from tests.conftest import OperatorFactory
from tests.harness.cluster import Cluster

pytestmark = pytest.mark.emulator_only

SAMPLE = "tests.harness.sample_operator"


async def test_create_adopt_status_delete_and_collect(
    cluster: Cluster, operator_factory: OperatorFactory
) -> None:
    started = time.monotonic()
    operator = await operator_factory(SAMPLE)
    api = cluster.api

    speech = api.create_speech("s1", {"model": "openbmb/MiniCPM-o-4_5"})
    config_map = await cluster.wait_for(lambda: api.get("configmap", "s1-config"))
    status = await cluster.wait_for(
        lambda: (api.get_speech("s1") or {}).get("status", {}).get("create_config")
    )

    [owner] = config_map["metadata"]["ownerReferences"]
    assert owner["uid"] == speech["metadata"]["uid"] and owner["controller"] is True
    assert config_map["data"] == {"model": "openbmb/MiniCPM-o-4_5"}
    assert status == {"configMap": "s1-config"}
    current = api.get_speech("s1")
    assert current and current["metadata"]["finalizers"]  # Kopf's, because of the delete handler
    [event] = await cluster.wait_for(lambda: api.list_objects("event"))
    assert (event["reason"], event["involvedObject"]["uid"]) == (
        "Configured",
        speech["metadata"]["uid"],
    )

    api.delete_speech("s1")
    await cluster.wait_for(
        lambda: api.get_speech("s1") is None, message="the finalizer is released"
    )
    assert api.get("configmap", "s1-config") is None  # collected with its owner
    await operator.stop()
    elapsed = time.monotonic() - started

    assert "Handler 'create_config' succeeded" in operator.output
    assert "Handler 'release' succeeded" in operator.output
    log = cluster.request_log()
    assert {(e.verb, e.resource, e.subresource) for e in log} >= {
        ("watch", "minicpmspeeches", None),
        ("patch", "minicpmspeeches", None),
        ("patch", "minicpmspeeches", "status"),
        ("create", "configmaps", None),
        ("create", "events", None),
    }
    print(f"lifecycle took {elapsed:.2f}s")


async def test_the_operator_can_be_restarted_within_a_test(
    cluster: Cluster, operator_factory: OperatorFactory
) -> None:
    operator = await operator_factory(SAMPLE)
    cluster.api.create_speech("before", {})
    await cluster.wait_for(lambda: cluster.api.get("configmap", "before-config"))

    await operator.restart()  # a fresh registry and a fresh import of the module
    cluster.api.create_speech("after", {})
    await cluster.wait_for(lambda: cluster.api.get("configmap", "after-config"))
    await operator.stop()

    assert len(operator.runners) == 2
    assert operator.output.count("Handler 'create_config' succeeded") == 2


async def test_an_operator_failure_fails_the_stop(operator_factory: OperatorFactory) -> None:
    operator = await operator_factory("tests.harness.no_such_module")

    with pytest.raises(AssertionError, match="the operator failed"):
        await operator.stop()


async def test_a_test_may_expect_the_operator_to_fail(operator_factory: OperatorFactory) -> None:
    operator = await operator_factory("tests.harness.no_such_module", check_exception=False)

    runner = await operator.stop()

    assert isinstance(runner.exception, ModuleNotFoundError)
