"""What the rendered chart allows the operator's ServiceAccount to do.

Reusable outside the chart tests, e.g. to replay recorded API requests:

    from tests.chart.rbac import rendered_rules, is_allowed

    rules = rendered_rules({"watch": {"namespaces": ["a", "b"]}}, namespace="a")
    assert is_allowed(rules, "patch", "serving.minicpm-speech.io", "minicpmspeeches", "status")

``rendered_rules(values)`` with no namespace is the union of every rule granted anywhere.
Pass ``namespace="x"`` for the rules that apply to a request in namespace x
(ClusterRoleBinding rules plus the Roles bound in x), or ``namespace=None`` for a
cluster-scoped request (a CRD, or a list/watch across all namespaces), which only a
ClusterRoleBinding can allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.chart.rendering import RELEASE_NAMESPACE, find, only, render_objects

ANY_NAMESPACE = "*"  # not a valid namespace name, so it cannot collide with one


@dataclass(frozen=True)
class Grant:
    """One PolicyRule and where it applies: a namespace, or None for cluster-wide."""

    namespace: str | None
    rule: dict[str, Any]


def _service_account(
    objects: list[dict[str, Any]], release_namespace: str = RELEASE_NAMESPACE
) -> tuple[str, str]:
    pod_spec = only(objects, "Deployment")["spec"]["template"]["spec"]
    return release_namespace, pod_spec["serviceAccountName"]


def _binds(binding: dict[str, Any], account: tuple[str, str]) -> bool:
    namespace, name = account
    return any(
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == name
        and subject.get("namespace", binding["metadata"].get("namespace")) == namespace
        for subject in binding.get("subjects") or []
    )


def _role_rules(
    objects: list[dict[str, Any]], ref: dict[str, Any], namespace: str | None
) -> list[dict[str, Any]]:
    kind = ref["kind"]
    roles = find(objects, kind, ref["name"], namespace if kind == "Role" else None)
    return [rule for role in roles for rule in role.get("rules") or []]


def rendered_grants(
    values: dict[str, Any] | None = None, release_namespace: str = RELEASE_NAMESPACE
) -> list[Grant]:
    """Every rule bound to the operator's ServiceAccount, with its scope."""
    objects = render_objects(values, release_namespace)
    account = _service_account(objects, release_namespace)
    grants = []
    for binding in find(objects, "ClusterRoleBinding"):
        if _binds(binding, account):
            grants += [Grant(None, rule) for rule in _role_rules(objects, binding["roleRef"], None)]
    for binding in find(objects, "RoleBinding"):
        if _binds(binding, account):
            namespace = binding["metadata"]["namespace"]
            rules = _role_rules(objects, binding["roleRef"], namespace)
            grants += [Grant(namespace, rule) for rule in rules]
    return grants


def rendered_rules(
    values: dict[str, Any] | None = None,
    *,
    namespace: str | None = ANY_NAMESPACE,
    release_namespace: str = RELEASE_NAMESPACE,
) -> list[dict[str, Any]]:
    """The PolicyRules granted to the operator's ServiceAccount (see the module doc)."""
    grants = rendered_grants(values, release_namespace)
    if namespace == ANY_NAMESPACE:
        return [grant.rule for grant in grants]
    return [grant.rule for grant in grants if grant.namespace in (None, namespace)]


def _matches(allowed: list[str], value: str) -> bool:
    return "*" in allowed or value in allowed


def _resource_matches(allowed: list[str], resource: str, subresource: str | None) -> bool:
    # Kubernetes RBAC: "*" matches everything, "pods/log" one subresource, "*/scale" a
    # subresource of any resource; a bare "pods" never matches "pods/status".
    if "*" in allowed:
        return True
    if subresource is None:
        return resource in allowed
    return f"{resource}/{subresource}" in allowed or f"*/{subresource}" in allowed


def is_allowed(
    rules: list[dict[str, Any]],
    verb: str,
    group: str,
    resource: str,
    subresource: str | None = None,
    name: str | None = None,
) -> bool:
    """Whether any rule allows the request, matched as the Kubernetes RBAC authorizer does.

    ``group`` is "" for the core API. A rule with resourceNames only allows requests
    for one of those names, so ``create`` (which has no name yet) never matches one.
    """
    for rule in rules:
        if "nonResourceURLs" in rule:
            continue
        if not _matches(rule.get("verbs") or [], verb):
            continue
        if not _matches(rule.get("apiGroups") or [], group):
            continue
        if not _resource_matches(rule.get("resources") or [], resource, subresource):
            continue
        names = rule.get("resourceNames") or []
        if names and name not in names:
            continue
        return True
    return False
