"""The chart grants the operator exactly the API requests it makes, and nothing else.

The expected lists are written out by hand: a rule added to the chart without adding it
here fails, and so does a rule that goes missing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.rbac import is_allowed, rendered_grants, rendered_rules
from tests.chart.rendering import RELEASE_NAME, RELEASE_NAMESPACE, VALUE_SETS, render_objects

GROUP = "serving.minicpm-speech.io"
LEASE = f"{RELEASE_NAME}-leader"

# (apiGroup, resource[/subresource], verb, resourceName or None)
Permission = tuple[str, str, str, str | None]
Scoped = set[tuple[str | None, Permission]]

# What the operator needs in a namespace it watches.
WATCHED_NAMESPACE: set[Permission] = {
    *((GROUP, "minicpmspeeches", verb, None) for verb in ("get", "list", "watch", "patch")),
    (GROUP, "minicpmspeeches/status", "patch", None),
    *(("", "configmaps", verb, None) for verb in ("get", "list", "watch", "create", "patch")),
    *(("", "services", verb, None) for verb in ("get", "list", "watch", "create", "patch")),
    *(("apps", "deployments", verb, None) for verb in ("get", "list", "watch", "create", "patch")),
    *(("autoscaling", "horizontalpodautoscalers", verb, None)
      for verb in ("get", "create", "patch", "delete")),
    ("", "secrets", "get", None),
    ("", "events", "create", None),
    *(("batch", "jobs", verb, None) for verb in ("get", "list", "watch", "create", "delete")),
    ("", "pods", "list", None),
}
# Leader election, in the release namespace only.
LEADER_ELECTION: set[Permission] = {
    ("coordination.k8s.io", "leases", "create", None),
    ("coordination.k8s.io", "leases", "get", LEASE),
    ("coordination.k8s.io", "leases", "patch", LEASE),
}


def granted(values: dict[str, Any]) -> Scoped:
    """Every (scope, (group, resource, verb, name)) the chart grants, rules flattened."""
    flat: Scoped = set()
    for grant in rendered_grants(values):
        rule = grant.rule
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        flat.add((grant.namespace, (group, resource, verb, name)))
    return flat


def scoped(namespace: str | None, grants: set[Permission]) -> Scoped:
    return {(namespace, grant) for grant in grants}


def test_default_grants_only_the_release_namespace() -> None:
    assert granted({}) == (
        scoped(RELEASE_NAMESPACE, WATCHED_NAMESPACE)
        | scoped(RELEASE_NAMESPACE, LEADER_ELECTION)
    )


def test_namespaced_mode_grants_each_watched_namespace() -> None:
    assert granted(VALUE_SETS["namespaced-two"]) == (
        scoped("speech-a", WATCHED_NAMESPACE)
        | scoped("speech-b", WATCHED_NAMESPACE)
        | scoped(RELEASE_NAMESPACE, LEADER_ELECTION)
    )


def test_cluster_wide_mode_grants_everywhere_and_leases_in_the_release_namespace() -> None:
    assert granted(VALUE_SETS["cluster-wide"]) == (
        scoped(None, WATCHED_NAMESPACE) | scoped(RELEASE_NAMESPACE, LEADER_ELECTION)
    )


def test_rbac_create_false_grants_nothing() -> None:
    assert rendered_rules({"rbac": {"create": False}}) == []


# The only deletions: benchmark Jobs the operator created (superseded, or beyond the history),
# and the autoscaler of a resource whose autoscaling was turned off.
DELETABLE = {("batch", "jobs"), ("autoscaling", "horizontalpodautoscalers")}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_nothing_destructive_or_broad_is_ever_granted(value_set: str) -> None:
    for rule in rendered_rules(VALUE_SETS[value_set]):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(
            rule["verbs"]
        ), rule
        if "delete" in rule["verbs"]:
            targets = {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
            assert targets <= DELETABLE, rule


def test_namespaced_mode_allows_nothing_outside_the_watched_namespaces() -> None:
    values = VALUE_SETS["namespaced-two"]
    for namespace in ("default", "kube-system", RELEASE_NAMESPACE):
        rules = rendered_rules(values, namespace=namespace)
        assert not is_allowed(rules, "list", GROUP, "minicpmspeeches")
        assert not is_allowed(rules, "get", "", "secrets", name="token")
    # Listing across all namespaces needs a ClusterRoleBinding, which this mode has not.
    assert not is_allowed(rendered_rules(values, namespace=None), "watch", GROUP, "minicpmspeeches")
    assert is_allowed(
        rendered_rules(values, namespace="speech-b"), "watch", GROUP, "minicpmspeeches"
    )


def test_is_allowed_matches_like_the_rbac_authorizer() -> None:
    rules = rendered_rules({})
    assert is_allowed(rules, "patch", GROUP, "minicpmspeeches", "status")
    assert not is_allowed(rules, "update", GROUP, "minicpmspeeches", "status")
    assert not is_allowed(rules, "get", GROUP, "minicpmspeeches", "status")
    assert not is_allowed(rules, "update", "coordination.k8s.io", "leases", name=LEASE)
    assert not is_allowed(rules, "patch", GROUP, "minicpmspeeches", "scale")
    assert not is_allowed(rules, "list", "", "secrets")
    assert not is_allowed(rules, "watch", "", "secrets")
    assert not is_allowed(rules, "delete", "apps", "deployments")
    assert not is_allowed(rules, "delete", "", "configmaps")
    assert is_allowed(rules, "delete", "autoscaling", "horizontalpodautoscalers")
    assert not is_allowed(rules, "watch", "autoscaling", "horizontalpodautoscalers")
    assert not is_allowed(rules, "get", "", "pods")
    assert is_allowed(rules, "delete", "batch", "jobs")
    assert not is_allowed(rules, "create", "events.k8s.io", "events")
    assert not is_allowed(rules, "list", "", "namespaces")
    assert is_allowed(rules, "get", "coordination.k8s.io", "leases", name=LEASE)
    assert not is_allowed(rules, "get", "coordination.k8s.io", "leases", name="another")
    assert not is_allowed(rules, "get", "coordination.k8s.io", "leases")
    assert is_allowed(rules, "create", "coordination.k8s.io", "leases")
    wildcard = [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}]
    assert is_allowed(wildcard, "update", "apps", "deployments", "status")
    assert not is_allowed(wildcard, "update", "apps", "deployments")


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_role_is_bound_to_the_service_account(value_set: str) -> None:
    # A role without a binding to the ServiceAccount would silently grant nothing.
    objects = render_objects(VALUE_SETS[value_set])
    role_rules = [
        rule for obj in objects if obj["kind"] in ("Role", "ClusterRole") for rule in obj["rules"]
    ]
    assert len(rendered_rules(VALUE_SETS[value_set])) == len(role_rules)
