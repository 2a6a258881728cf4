"""One value set, one observable result: each test changes a single value and checks it."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.chart.rendering import (
    RELEASE_NAME,
    RELEASE_NAMESPACE,
    find,
    only,
    operator_container,
    render_notes,
    render_objects,
)


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def args(values: dict[str, Any] | None = None) -> list[str]:
    arguments: list[str] = operator_container(render_objects(values))["args"]
    return arguments


# --- the defaults are production-shaped ---------------------------------------------------


def test_default_pod_is_locked_down() -> None:
    objects = render_objects()
    pod = pod_spec(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(objects)["securityContext"]
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}


def test_default_container_has_requests_limits_and_probes() -> None:
    container = operator_container(render_objects())
    assert set(container["resources"]) == {"requests", "limits"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]


def test_default_command_line() -> None:
    container = operator_container(render_objects())
    assert container["command"] == ["minicpm-speech"]
    assert container["args"] == [
        "operator",
        f"--namespace={RELEASE_NAMESPACE}",
        "--leader-elect",
        f"--leader-election-namespace={RELEASE_NAMESPACE}",
        f"--leader-election-name={RELEASE_NAME}-leader",
        "--lease-duration=15",
        "--lease-renew-deadline=10",
        "--lease-retry-period=2",
        "--log-level=INFO",
        "--metrics-port=8080",
        "--health-port=8081",
    ]


def test_lease_timing_and_log_level_are_values() -> None:
    args = operator_container(render_objects({
        "leaderElection": {"leaseDuration": 30, "renewDeadline": 20, "retryPeriod": 4},
        "logLevel": "DEBUG"}))["args"]
    assert {"--lease-duration=30", "--lease-renew-deadline=20", "--lease-retry-period=4",
            "--log-level=DEBUG"} <= set(args)


def test_pod_name_is_the_leader_identity() -> None:
    env = {e["name"]: e for e in operator_container(render_objects())["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_default_has_metrics_service_but_no_monitor_or_budget() -> None:
    objects = render_objects()
    service = only(objects, "Service")
    assert service["spec"]["ports"][0]["port"] == 8080
    assert (
        service["spec"]["selector"]
        == only(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert find(objects, "ServiceMonitor") == []
    assert find(objects, "PodDisruptionBudget") == []


def test_default_image_is_the_app_version() -> None:
    image = operator_container(render_objects())["image"]
    assert image == "ghcr.io/minicpm-speech/operator:0.1.0"


# --- one value, one result ----------------------------------------------------------------


def test_replicas_two_adds_a_disruption_budget() -> None:
    objects = render_objects({"replicas": 2})
    assert only(objects, "Deployment")["spec"]["replicas"] == 2
    assert only(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_replicas_two_without_budget() -> None:
    objects = render_objects({"replicas": 2, "podDisruptionBudget": {"enabled": False}})
    assert find(objects, "PodDisruptionBudget") == []


def test_leader_election_stays_on_for_one_replica() -> None:
    assert "--leader-elect" in args({"replicas": 1})


def test_watch_namespaces() -> None:
    namespaced = args({"watch": {"namespaces": ["speech-a", "speech-b"]}})
    assert [a for a in namespaced if a.startswith("--namespace")] == [
        "--namespace=speech-a",
        "--namespace=speech-b",
    ]
    assert "--all-namespaces" not in namespaced


def test_watch_namespaces_creates_roles_there() -> None:
    objects = render_objects({"watch": {"namespaces": ["speech-a", "speech-b"]}})
    role_namespaces = {r["metadata"]["namespace"] for r in find(objects, "Role")}
    assert role_namespaces == {"speech-a", "speech-b", RELEASE_NAMESPACE}  # + leader election
    bindings = {b["metadata"]["namespace"] for b in find(objects, "RoleBinding")}
    assert bindings == role_namespaces


def test_cluster_wide() -> None:
    cluster_wide = args({"watch": {"clusterWide": True}})
    assert "--all-namespaces" in cluster_wide
    assert not [a for a in cluster_wide if a.startswith("--namespace")]


def test_image_digest_wins_over_tag() -> None:
    digest = "sha256:" + "0" * 64
    values = {"image": {"tag": "9.9.9", "digest": digest}}
    image = operator_container(render_objects(values))["image"]
    assert image == f"ghcr.io/minicpm-speech/operator@{digest}"


def test_image_tag() -> None:
    image = operator_container(render_objects({"image": {"tag": "0.2.0"}}))["image"]
    assert image.endswith(":0.2.0")


def test_service_monitor() -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    objects = render_objects(values)
    monitor = only(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["endpoints"][0]["port"]
        == only(objects, "Service")["spec"]["ports"][0]["name"]
    )
    service_labels = only(objects, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()


def test_metrics_service_off() -> None:
    assert find(render_objects({"metrics": {"service": {"enabled": False}}}), "Service") == []


def test_metrics_port() -> None:
    objects = render_objects({"metrics": {"port": 9090}})
    assert "--metrics-port=9090" in operator_container(objects)["args"]
    assert only(objects, "Service")["spec"]["ports"][0]["port"] == 9090


def test_metrics_and_health_ports_must_differ() -> None:
    with pytest.raises(
        helm.HelmRenderError, match=re.escape("metrics.port and health.port must differ")
    ):
        render_objects({"metrics": {"port": 8081}})


def test_rbac_off_renders_no_rbac_objects() -> None:
    kinds = {o["kind"] for o in render_objects({"rbac": {"create": False}})}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_existing_service_account() -> None:
    objects = render_objects({"serviceAccount": {"create": False, "name": "speech-operator"}})
    assert find(objects, "ServiceAccount") == []
    assert pod_spec(objects)["serviceAccountName"] == "speech-operator"
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        assert binding["subjects"][0]["name"] == "speech-operator"


def test_existing_service_account_needs_a_name() -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape("serviceAccount.name is required")):
        render_objects({"serviceAccount": {"create": False}})


def test_run_as_user_null_lets_the_platform_choose() -> None:
    objects = render_objects({"podSecurityContext": {"runAsUser": None, "runAsGroup": None}})
    context = pod_spec(objects)["securityContext"]
    assert "runAsUser" not in context and "runAsGroup" not in context
    assert context["runAsNonRoot"] is True


def test_extra_args_come_last() -> None:
    assert args({"extraArgs": ["--log-level=DEBUG"]})[-1] == "--log-level=DEBUG"


def test_fullname_override() -> None:
    objects = render_objects({"fullnameOverride": "speech"})
    assert only(objects, "Deployment")["metadata"]["name"] == "speech"
    assert "--leader-election-name=speech-leader" in operator_container(objects)["args"]


def test_resources_merge_with_the_defaults() -> None:
    values = {"resources": {"requests": {"cpu": "200m"}}}
    resources = operator_container(render_objects(values))["resources"]
    assert resources["requests"] == {"cpu": "200m", "memory": "128Mi"}
    assert resources["limits"] == {"cpu": "500m", "memory": "512Mi"}


def test_node_selector_and_tolerations() -> None:
    toleration = {"key": "ops", "operator": "Exists", "effect": "NoSchedule"}
    values = {"nodeSelector": {"pool": "ops"}, "tolerations": [toleration]}
    pod = pod_spec(render_objects(values))
    assert pod["nodeSelector"] == {"pool": "ops"}
    assert pod["tolerations"] == [toleration]


def test_pod_labels_keep_the_selector_labels() -> None:
    objects = render_objects({"podLabels": {"team": "speech"}})
    labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "speech"
    assert only(objects, "Deployment")["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --- NOTES.txt ----------------------------------------------------------------------------


def test_notes_give_the_next_command_in_the_watched_namespace() -> None:
    notes = render_notes({"watch": {"namespaces": ["speech-a"]}})
    assert "kubectl -n speech-a apply -f examples/minicpmspeech.yaml" in notes
    assert "kubectl -n speech-a get mcs" in notes
    assert "0.1.0" in notes


def test_notes_cluster_wide_use_the_current_namespace() -> None:
    notes = render_notes({"watch": {"clusterWide": True}})
    assert "kubectl apply -f examples/minicpmspeech.yaml" in notes
    assert "every namespace" in notes


def test_notes_warn_that_cluster_wide_reaches_every_namespace() -> None:
    notes = render_notes({"watch": {"clusterWide": True}}).lstrip()
    assert notes.startswith("WARNING: watch.clusterWide is true")
    assert "read any Secret" in notes and "watch.namespaces" in notes


def test_notes_warn_first() -> None:
    notes = render_notes({"replicas": 0}).lstrip()
    assert notes.startswith("WARNING: replicas is 0")
    assert render_notes({"rbac": {"create": False}}).lstrip().startswith("WARNING: rbac.create")
    assert "WARNING" not in render_notes()
