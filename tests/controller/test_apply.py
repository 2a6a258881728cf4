"""Convergence compares only what the operator sets, and removes what it stopped setting."""

from __future__ import annotations

from minicpm_speech_operator.apply import is_subset, merge_patch, stale_keys


def test_server_defaults_and_foreign_keys_are_not_drift() -> None:
    desired = {"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "s"}]}}}}
    live = {"spec": {"replicas": 1, "revisionHistoryLimit": 10, "template": {"spec": {
        "containers": [{"name": "s", "terminationMessagePath": "/dev/termination-log"}],
        "dnsPolicy": "ClusterFirst"}}}}
    assert is_subset(desired, live)


def test_changed_list_or_value_is_drift() -> None:
    assert not is_subset({"a": [1, 2]}, {"a": [1]})
    assert not is_subset({"a": {"b": "x"}}, {"a": {"b": "y"}})
    assert not is_subset({"a": True}, {"a": 1})


def test_quantities_read_back_as_strings_match() -> None:
    assert is_subset({"limits": {"nvidia.com/gpu": 1}}, {"limits": {"nvidia.com/gpu": "1"}})


def test_owned_map_keys_no_longer_wanted_are_nulled() -> None:
    desired = {"kind": "ConfigMap", "apiVersion": "v1", "data": {"new.yaml": "x"}}
    live = {"kind": "ConfigMap", "apiVersion": "v1", "data": {"new.yaml": "x", "old.yaml": "y"}}
    assert is_subset(desired, live)
    assert stale_keys(desired, live) == {("data",): ["old.yaml"]}
    assert merge_patch(desired, live) == {"data": {"new.yaml": "x", "old.yaml": None}}


def test_node_selector_removed_from_spec_is_removed_from_pod() -> None:
    desired = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": []}}}}
    live = {"kind": "Deployment",
            "spec": {"template": {"spec": {"containers": [], "nodeSelector": {"gpu": "h200"}}}}}
    patch = merge_patch(desired, live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": None}
