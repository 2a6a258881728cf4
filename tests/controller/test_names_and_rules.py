"""Names every child can carry, and the spec's cross-field rules, judged alike by the CRD's
schema and CEL rules and by the operator. The CEL rules are evaluated, not only read: by a
CEL interpreter with Kubernetes' quantity library (tests/harness/cel.py), as an API server of
1.29 or later evaluates them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from minicpm_speech_operator import names
from minicpm_speech_operator.crd_schema import manifest_errors, version_schema, with_defaults
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.manifests import Owner, build_children, configmap_name
from minicpm_speech_operator.perf.lastgood import lastgood_name
from minicpm_speech_operator.serving_config import profile_document, serving_config
from minicpm_speech_operator.spec import parse_spec, quantity

from tests.harness.cel import rule_failures

from .builders import claim_spec, example_manifest

LONGEST = "a" + "b" * (names.MAX_NAME_LENGTH - 1)


def rules(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The CEL rules of one schema node, by the field they report."""
    return {rule.get("fieldPath", ""): rule for rule in schema["x-kubernetes-validations"]}


def server_refusals(manifest: dict[str, Any]) -> list[str]:
    """Why an API server would refuse ``manifest``: its schema, then its CEL rules."""
    schema = version_schema()
    return [*(error.field for error in manifest_errors(manifest)),
            *(f"{failure.path}: {failure.message}"
              for failure in rule_failures(schema, with_defaults(schema, manifest)))]


def with_spec(spec: dict[str, Any], name: str = "speech") -> dict[str, Any]:
    return {**example_manifest(), "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


def runtime_schema() -> dict[str, Any]:
    runtime: dict[str, Any] = version_schema()["properties"]["spec"]["properties"]["runtime"]
    return runtime


# --- the resource's name ---------------------------------------------------------------

def test_the_longest_child_name_decides_the_limit() -> None:
    owner = Owner(LONGEST, "default", "uid")
    assert names.MAX_NAME_LENGTH == 63
    assert len(lastgood_name(owner)) <= names.DNS1123_SUBDOMAIN_MAX
    assert configmap_name(owner).endswith(names.DEPLOY_CONFIG_SUFFIX)
    assert lastgood_name(owner).endswith(names.LASTGOOD_SUFFIX)


def test_the_crd_cel_rule_is_the_python_rule() -> None:
    (rule,) = version_schema()["x-kubernetes-validations"]
    assert rule["rule"] == names.NAME_RULE
    assert f"size() <= {names.MAX_NAME_LENGTH}" in rule["rule"]
    assert f"'{names.NAME_PATTERN}'" in rule["rule"]
    assert str(names.MAX_NAME_LENGTH) in rule["message"]


@pytest.mark.parametrize(("name", "words"), [
    ("my.speech", "not a DNS-1035 label"),
    ("1speech", "not a DNS-1035 label"),
    ("Speech", "not a DNS-1035 label"),
    ("speech-", "not a DNS-1035 label"),
    ("a" * 64, "more than 63"),
])
def test_names_no_service_can_carry_are_refused(name: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        names.check_resource_name(name)
    assert refused.value.field == "metadata.name" and words in refused.value.message
    assert "at most 63 characters" in refused.value.fix
    # the CRD's CEL rule, evaluated, says the same
    manifest = with_spec(example_manifest()["spec"], name)
    schema = version_schema()
    failures = rule_failures(schema, with_defaults(schema, manifest))
    assert [f.message for f in failures] == [schema["x-kubernetes-validations"][0]["message"]]
    assert manifest_errors(manifest)[0].field == "metadata.name"


@pytest.mark.parametrize("name", ["s", "speech-2", LONGEST])
def test_names_every_child_can_carry_pass(name: str) -> None:
    names.check_resource_name(name)
    assert server_refusals(with_spec(example_manifest()["spec"], name)) == []
    spec = parse_spec(example_manifest()["spec"])
    children = build_children(Owner(name, "default", "uid"), spec,
                              serving_config(spec, profile_document(spec, None)))
    names.check_children(children)


def test_a_child_the_server_would_refuse_stops_the_whole_set() -> None:
    spec = parse_spec(example_manifest()["spec"])
    cfg = serving_config(spec, profile_document(spec, None))
    children = build_children(Owner("speech", "default", "uid"), spec, cfg)
    children[-1]["metadata"]["labels"]["app.kubernetes.io/instance"] = "x" * 64
    with pytest.raises(InvalidSpec, match="cannot be created: label"):
        names.check_children(children)
    children = build_children(Owner("my.speech", "default", "uid"), spec, cfg)
    with pytest.raises(InvalidSpec, match=r"Service my\.speech: cannot be created"):
        names.check_children(children)


@pytest.mark.parametrize(("key", "value", "ok"), [
    ("app.kubernetes.io/instance", "speech", True),
    ("app", "", True),
    ("app", "a_b.c-d", True),
    ("app", "-a", False),
    ("app", "a" * 64, False),
    ("Bad_Prefix/app", "a", False),
    ("x/" + "a" * 64, "a", False),
])
def test_label_rules(key: str, value: str, ok: bool) -> None:
    assert (names.label_problem(key, value) is None) is ok


# --- quantities ------------------------------------------------------------------------

@pytest.mark.parametrize(("small", "large"), [
    ("500m", "1"), ("1", "1.5"), ("1G", "1Gi"), ("1023Mi", "1Gi"), ("0", "1m"), ("64Gi", "96Gi"),
])
def test_quantities_compare_across_suffixes(small: str, large: str) -> None:
    assert quantity("f", small) < quantity("f", large)


def test_a_quantity_that_is_not_one_names_its_field() -> None:
    with pytest.raises(InvalidSpec) as refused:
        quantity("spec.runtime.shmSizeLimit", "lots")
    assert refused.value.field == "spec.runtime.shmSizeLimit"


# --- cross-field rules: the operator ---------------------------------------------------

@pytest.mark.parametrize(("runtime", "field", "words"), [
    ({"port": 9400}, "spec.runtime.healthPort", "also spec.runtime.port"),
    ({"port": 8000, "healthPort": 8000}, "spec.runtime.healthPort", "also spec.runtime.port"),
    ({"shmSizeLimit": "0"}, "spec.runtime.shmSizeLimit", "no shared memory"),
    ({"shmSizeLimit": "0.0Gi"}, "spec.runtime.shmSizeLimit", "no shared memory"),
    ({"image": "not an image!"}, "spec.runtime.image", "wrong format"),
    ({"image": "ghcr.io/x/y:1.0:2"}, "spec.runtime.image", "wrong format"),
    ({"image": "ghcr.io/x/y@sha256:abc"}, "spec.runtime.image", "wrong format"),
    ({"resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "7500m"}}},
     "spec.runtime.resources.limits.cpu", "below requests.cpu"),
    ({"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1G"}}},
     "spec.runtime.resources.limits.memory", "below requests.memory"),
])
def test_cross_field_rules_refuse(runtime: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(claim_spec(**runtime))
    assert refused.value.field == field and words in refused.value.message
    refusals = server_refusals(with_spec(claim_spec(**runtime)))
    assert len(refusals) == 1 and field.rpartition(".")[2] in refusals[0], refusals


def test_a_perf_image_that_is_not_one_is_refused() -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec({**claim_spec(), "perf": {"image": "a b"}})
    assert refused.value.field == "spec.perf.image"
    assert "[registry/]path[:tag][@sha256:digest]" in refused.value.fix


@pytest.mark.parametrize("runtime", [
    {"image": "busybox"},
    {"image": "localhost:5000/team/runtime:dev_1.2-rc"},
    {"image": "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "0" * 64},
    {"shmSizeLimit": "512Mi"},
    {"port": 8000, "healthPort": 8001},
    {"resources": {"requests": {"cpu": "500m", "memory": "1G"},
                   "limits": {"cpu": "1", "memory": "1Gi"}}},
    {"resources": {"limits": {"cpu": "1"}}},
    {"resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                   "limits": {"cpu": "1000m", "memory": "1024Mi"}}},  # equal is enough
])
def test_cross_field_rules_accept(runtime: dict[str, Any]) -> None:
    parse_spec(claim_spec(**runtime))
    assert server_refusals(with_spec(claim_spec(**runtime))) == []


# --- cross-field rules: the CRD ----------------------------------------------------------

def test_the_crd_states_the_runtime_rules_in_cel() -> None:
    by_field = rules(runtime_schema())
    assert by_field[".healthPort"]["rule"] == "self.port != self.healthPort"
    assert "quantity(self.shmSizeLimit).isGreaterThan(quantity('0'))" in (
        by_field[".shmSizeLimit"]["rule"])
    resources = rules(runtime_schema()["properties"]["resources"])
    for kind in ("cpu", "memory"):
        rule = resources[f".limits.{kind}"]["rule"]
        assert f"quantity(self.limits.{kind}).compareTo(quantity(self.requests.{kind})) >= 0" \
            in rule
        assert f"!has(self.requests.{kind})" in rule and f"!has(self.limits.{kind})" in rule
    for rule in [*by_field.values(), *resources.values()]:
        assert rule["message"].startswith("spec.runtime.")
        # every fieldPath names a field the schema has
        node = runtime_schema() if rule in by_field.values() else runtime_schema()[
            "properties"]["resources"]
        for part in rule["fieldPath"].strip(".").split("."):
            node = node["properties"][part]


def test_the_crd_image_pattern_is_the_one_parse_spec_applies() -> None:
    runtime = runtime_schema()["properties"]["image"]
    perf = version_schema()["properties"]["spec"]["properties"]["perf"]["properties"]["image"]
    assert runtime["pattern"] == perf["pattern"]
    pattern = runtime["pattern"]
    assert re.search(pattern, runtime["default"])
    for bad in ("not an image!", "a:b:c", "a//b", ":tag", "http://x/y"):
        assert not re.search(pattern, bad)
