"""Hostile and odd input, generated: the operator answers every case in status and stays up.

Hypothesis draws a batch of cases with a fixed seed: specs with values of every type at the
fields users write, overrides and profile ConfigMaps that are deep, huge, aliased, unicode
or at the edges of numbers. One real operator process (Kopf's runner against the emulator)
takes them all. For each case it must, within a bound, either reconcile it or refuse it with
a status naming a field; every message stays within 1 KiB; no handler may fail with an
unexpected exception; and the process's memory stays under the chart's 512 MiB limit.

``MINICPM_SPEECH_FUZZ_CASES`` sets how many cases are drawn (the test command draws 40, after
four written out: an alias bomb, a 500-deep profile, 500-deep overrides and a 900 KB value).
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any, NamedTuple

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from minicpm_speech_operator import metrics
from minicpm_speech_operator.errors import MESSAGE_LIMIT

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import example_spec

CASES = int(os.environ.get("MINICPM_SPEECH_FUZZ_CASES", "40"))
ANSWER_WITHIN_S = 20.0
MEMORY_LIMIT_BYTES = 512 << 20  # the chart's default limit for the operator
PHASES = {"Pending", "Progressing", "Ready", "Degraded"}
EXTRA = ("connectors", "connector_of_shared_memory", "extra")

EDGE_NUMBERS = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63),
                                0.5, 1e308, -1e-308, 65535, 65536])
EDGE_STRINGS = st.sampled_from(["", " ", "0", "true", "null", "~", "-", "a" * 64, "é" * 40,
                                "\u202e", "💥", "x\ny", "{{ .Values }}", "${HOME}",
                                "../../etc/passwd", "*alias", "&anchor x", "0x1F", "1e9"])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), EDGE_NUMBERS,
                 st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
                 EDGE_STRINGS)
JSONISH = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.text(max_size=12), EDGE_STRINGS), inner, max_size=4),
    max_leaves=24)
HUGE = st.integers(min_value=20_000, max_value=200_000).map(lambda n: Huge(n))


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"n": value}
    return value


class Deep(NamedTuple):
    """A mapping ``depth`` levels deep, built only when the case runs: printed whole, a failing
    case would overflow the printer's own recursion."""

    depth: int


class Huge(NamedTuple):
    """A string of ``size`` characters, likewise built only when the case runs."""

    size: int


def built(value: Any) -> Any:
    """``value`` with every :class:`Deep` and :class:`Huge` in it made real."""
    if isinstance(value, Deep):
        return nested(value.depth)
    if isinstance(value, Huge):
        return "h" * value.size
    if isinstance(value, dict):
        return {key: built(item) for key, item in value.items()}
    if isinstance(value, list):
        return [built(item) for item in value]
    return value


DEEP = st.integers(min_value=40, max_value=600).map(Deep)
VALUE = st.one_of(JSONISH, JSONISH, JSONISH, HUGE, DEEP)
# Where users write: every field of the example spec, its sections, and the extras.
SPEC_PATHS = st.sampled_from([
    ("replicas",), ("profile",), ("profile", "name"), ("profileOverrides",),
    ("model",), ("model", "huggingFace"), ("model", "huggingFace", "repo"),
    ("model", "huggingFace", "revision"), ("model", "servedModelName"),
    ("runtime",), ("runtime", "image"), ("runtime", "port"), ("runtime", "healthPort"),
    ("runtime", "mps"), ("runtime", "mps", "activeThreadPercentage"),
    ("runtime", "graphPrecapture"), ("runtime", "resources"), ("perf",),
    ("profileOverrides", *EXTRA, "micro_batch_size"),
    ("profileOverrides", *EXTRA, "setup_graph_batch_sizes"),
    ("profileOverrides", "stages"), ("unknownField",),
    ("slo",), ("slo", "firstAudioP95Ms"), ("profile", "search"),
    ("profile", "search", "grid"), ("profile", "search", "profiles"),
])


def alias_bomb(levels: int, fanout: int) -> str:
    lines = ['l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join(f"*l{level - 1}" for _ in range(fanout))
        lines.append(f"l{level}: &l{level} [{refs}]")
    lines.append(f"stages: *l{levels}")
    return "\n".join(lines) + "\n"


PROFILE_TEXT = st.one_of(
    st.builds(alias_bomb, st.integers(3, 12), st.integers(2, 10)),
    st.integers(50, 800).map(lambda d: "stages: " + "[" * d + "]" * d + "\n"),
    JSONISH.map(lambda doc: yaml.safe_dump(doc, allow_unicode=True)),
    st.text(max_size=200),
    st.just("stages:\n  - stage_id: 1\n    max_num_seqs: 4\n"),
)


@st.composite
def case(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["spec", "spec", "overrides", "profile"]))
    spec = example_spec()
    profile_text = None
    if kind == "spec":
        for _ in range(draw(st.integers(1, 3))):
            put(spec, draw(SPEC_PATHS), draw(VALUE))
    elif kind == "overrides":
        spec["profileOverrides"] = draw(st.one_of(VALUE, st.builds(
            lambda v: {"connectors": {"connector_of_shared_memory": {"extra": v}}}, VALUE)))
    else:
        profile_text = draw(PROFILE_TEXT)
    return {"kind": kind, "spec": spec, "profile_text": profile_text}


def put(document: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = document
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def answered(cluster: Cluster, name: str) -> dict[str, Any] | None:
    speech = cluster.api.get_speech(name)
    status = (speech or {}).get("status") or {}
    generation = ((speech or {}).get("metadata") or {}).get("generation")
    return speech if speech and status.get("observedGeneration") == generation else None


_counter = iter(range(1_000_000))


def with_profile(text: str) -> dict[str, Any]:
    return {"kind": "profile", "spec": example_spec(), "profile_text": text}


def with_overrides(overrides: Any) -> dict[str, Any]:
    return {"kind": "overrides", "spec": {**example_spec(), "profileOverrides": overrides},
            "profile_text": None}


@pytest.mark.timeout(900)
@settings(max_examples=CASES, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@example(drawn=with_profile(alias_bomb(9, 9)))  # 9^9 nodes once expanded, from ~300 bytes
@example(drawn=with_profile("stages: " + "[" * 500 + "]" * 500 + "\n"))
@example(drawn=with_overrides(Deep(500)))
@example(drawn=with_overrides({"connectors": {"connector_of_shared_memory": {"extra": {
    "campplus_backend": Huge(900_000)}}}}))
@given(drawn=case())
async def test_every_hostile_case_is_answered_in_status(
    cluster: Cluster, operator: Operator, drawn: dict[str, Any]
) -> None:
    if not cluster.is_emulated:
        pytest.skip("the fuzzer's budget is sized for the emulator")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    failures_before = unexpected_failures()
    index = next(_counter)
    name = f"fuzz-{index}"
    spec = built(drawn["spec"])
    if drawn["profile_text"] is not None:
        cluster.api.create("configmap", {"metadata": {"name": f"{name}-profile"},
                                         "data": {"profile.yaml": drawn["profile_text"]}})
        spec["profile"] = {"configMapRef": {"name": f"{name}-profile"}}
    try:
        cluster.api.create_speech(name, spec)
    except Exception as refused:  # the API server's own checks said no: also an answer
        assert str(getattr(refused, "status", "")).startswith("4"), refused
        return
    started = time.monotonic()
    speech = await cluster.wait_for(lambda: answered(cluster, name), timeout=ANSWER_WITHIN_S,
                                    message=f"an answer in status for {drawn['kind']} case")
    assert time.monotonic() - started < ANSWER_WITHIN_S
    status = speech["status"]
    assert status["phase"] in PHASES, status
    for condition in status.get("conditions") or []:
        assert len(condition.get("message", "")) <= MESSAGE_LIMIT, condition
    if status["phase"] == "Degraded":
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["reason"] == "InvalidSpec", degraded
        assert degraded["message"].startswith(("spec.", "metadata.")), degraded
    assert operator.running
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak - peak_before < MEMORY_LIMIT_BYTES, peak - peak_before
    # a reconcile that raised anything but a transient API error is counted as "other"
    assert unexpected_failures() == failures_before, "a handler failed unexpectedly"
    cluster.api.delete_speech(name)


def unexpected_failures() -> float:
    return float(metrics.RETRIES.labels("other")._value.get())
