"""Kopf's record of the last handled spec is a digest: it changes with what the user changes,
never with what the operator or the server writes, and it stays small for any spec."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf
from minicpm_speech_operator.diffbase import DigestDiffBaseStorage
from minicpm_speech_operator.manifests import GROUP


def speech(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "MiniCPMSpeech",
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "1",
                         "labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {"profile": {"name": "default"}, **spec}, "status": {"phase": "Pending"}}


def essence(body: dict[str, Any]) -> Any:
    return DigestDiffBaseStorage().build(body=kopf.Body(body))


def test_the_operators_own_writes_do_not_count_as_a_change() -> None:
    before = speech()
    after = copy.deepcopy(before)
    after["metadata"]["resourceVersion"] = "9"
    after["status"] = {"phase": "Ready", "conditions": [{"type": "Ready"}]}
    after["metadata"]["annotations"][f"{GROUP}/reconcile_speech"] = '{"retries": 1}'
    assert essence(after) == essence(before)


def test_a_change_to_spec_labels_or_annotations_counts() -> None:
    base = essence(speech())
    assert essence(speech(replicas=2)) != base
    relabelled = speech()
    relabelled["metadata"]["labels"]["team"] = "b"
    assert essence(relabelled) != base
    annotated = speech()
    annotated["metadata"]["annotations"]["note"] = "y"
    assert essence(annotated) != base


def test_what_is_stored_is_small_for_any_spec() -> None:
    huge = speech(profileOverrides={"stages": [{"note": "x" * 1_000_000}]})
    stored = json.dumps(essence(huge))
    assert len(stored) < 100
