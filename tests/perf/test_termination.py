"""The termination message stays under 4 KiB in the worst case and validates on parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from minicpm_speech_contract import termination
from minicpm_speech_contract.termination import TerminationMessageError, parse_termination_message
from minicpm_speech_perf import protocol
from minicpm_speech_perf.summarize import Point, sweep_message

WORST_HEADER = {
    "config_hash": "h" * 64,
    "mode": "maintenance",
    "baseline": "a" * 16,
    "started": "2026-11-29T10:00:00Z",
    "finished": "2026-11-29T12:00:00Z",
    "status": "failed",
    "reason": "x" * 5000,
}


def worst_point(arm: str, c: int) -> Point:
    big = 123456.789012345
    return Point(arm, c, 4, big, big, big, big, big, big, big, big, big, 10**6, 10**6, big)


def test_worst_case_sweep_message_fits_and_round_trips() -> None:
    points = [worst_point(arm, c) for arm in ("a" * 16, "b" * 16) for c in protocol.CONCURRENCIES]
    text = sweep_message(WORST_HEADER, points)
    assert len(text.encode()) < 4096
    msg = parse_termination_message(text)
    assert len(msg["points"]) == 12
    assert msg["reason"] == "x" * 300
    assert msg["status"] == "failed"
    assert msg["points"][0]["tput"] == pytest.approx(123500.0)


def test_worst_case_wer_message_fits() -> None:
    from minicpm_speech_perf.wer import wer_message

    rows = [
        {"concurrency": c, "wer": 0.123456789, "completed": 64, "judged": 64, "total": 64,
         "sim": -0.123456789, "sim_p10": -0.987654321, "sim_n": 64, "mos": 4.987654321,
         "mos_p10": 1.23456789, "mos_n": 64, "rescored": 0.987654321, "rescored_judged": 64}
        for c in (8, 1, 32)
    ]  # fmt: skip
    doc = {
        "config_hash": "h" * 64,
        "mode": "live",
        "started": "2026-11-29T10:00:00Z",
        "finished": "2026-11-29T12:00:00Z",
        "status": "ok",
        "reason": "",
        "rows": rows,
        "sim_model": "m" * 64,
        "mos_model": "n" * 64,
    }
    text = wer_message(doc)
    assert len(text.encode()) < 4096
    msg = parse_termination_message(text)
    assert [w["c"] for w in msg["wer"]] == [8, 1, 32]
    assert msg["wer"][0]["wer"] == 0.1235 and msg["wer"][0]["rescored"] == 0.9877
    assert msg["wer"][0]["sim"] == -0.1235 and msg["wer"][0]["mos_p10"] == 1.235
    assert msg["sim_model"] == "m" * 64 and not msg["truncated"]


def test_truncation_keeps_the_figures_the_gate_reads() -> None:
    entry = {"c": 8, "wer": 0.03, "done": 64, "judged": 64, "n": 64, "sim": 0.7,
             "sim_p10": 0.6, "sim_n": 64, "mos": 3.9, "mos_p10": 3.5, "mos_n": 64,
             "rescored": 0.03, "rescored_judged": 64}
    doc = wer_doc(wer=[entry] * 25)
    msg = parse_termination_message(termination.encode(doc))
    assert msg["truncated"] and msg["wer"]
    assert "rescored" not in msg["wer"][0] and msg["wer"][0]["sim"] == 0.7


def wer_doc(**extra: Any) -> dict[str, Any]:
    doc = base_doc(kind="wer", wer=[
        {"c": 8, "wer": 0.03, "done": 64, "judged": 64, "n": 64, "sim": 0.7, "sim_n": 64,
         "mos": 3.9, "mos_n": 64}], sim_model="resemblyzer-0.1.4", truncated=False) | extra
    del doc["points"], doc["baseline"]
    return doc


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d["wer"][0].update(sim=1.5), "wer\\[0\\].sim: expected a cosine"),
    (lambda d: d["wer"][0].update(sim="high"), "wer\\[0\\].sim: expected a cosine"),
    (lambda d: d["wer"][0].update(mos=-1), "wer\\[0\\].mos: expected a non-negative"),
    (lambda d: d["wer"][0].update(sim_n=1.5), "wer\\[0\\].sim_n"),
    (lambda d: d.update(sim_model="no spaces allowed"), "sim_model: expected a model name"),
])
def test_parser_refuses_invalid_quality_figures(mutate: Any, needle: str) -> None:
    doc = wer_doc()
    mutate(doc)
    with pytest.raises(TerminationMessageError, match=needle):
        parse_termination_message(json.dumps(doc))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_figure_that_is_not_a_number_is_refused(token: str) -> None:
    doc = wer_doc()
    text = json.dumps(doc).replace('"sim": 0.7', f'"sim": {token}')
    assert token in text
    with pytest.raises(TerminationMessageError, match=f"holds {token}"):
        parse_termination_message(text)


def base_doc(**extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "sweep",
        "status": "ok",
        "hash": "abc",
        "mode": "dedicated",
        "started": "2026-11-29T10:00:00Z",
        "finished": "2026-11-29T12:00:00Z",
        "reason": "",
        "baseline": None,
        "points": [
            {"arm": "A", "c": 1, "tput": 8.4, "ttfp_ms": 310.0, "ttfp_p95_ms": 352.0,
             "ok": 256, "n": 256, "tput_min": 8.2, "tput_max": 8.6, "rtf": 0.12,
             "rps": 1.2, "mem_mib": None}
        ],
    } | extra  # fmt: skip


def test_oversized_content_is_truncated_not_cut() -> None:
    doc = base_doc(points=base_doc()["points"] * 60)
    text = termination.encode(doc)
    msg = parse_termination_message(text)
    assert msg["truncated"] is True
    assert len(text.encode()) <= termination.BUDGET_BYTES
    if msg["points"]:
        assert "tput_min" not in msg["points"][0]


def test_hugely_oversized_content_keeps_the_header() -> None:
    doc = base_doc(points=base_doc()["points"] * 400)
    msg = parse_termination_message(termination.encode(doc))
    assert msg["truncated"] and msg["points"] == [] and msg["hash"] == "abc"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(v=2), "v"),
        (lambda d: d.update(kind="bench"), "kind"),
        (lambda d: d.update(status="done"), "status"),
        (lambda d: d.update(hash=""), "hash"),
        (lambda d: d.update(mode="shared"), "mode"),
        (lambda d: d.update(started="yesterday"), "started"),
        (lambda d: d.update(status="failed"), "reason"),
        (lambda d: d.update(reason="r" * 301), "reason"),
        (lambda d: d.pop("truncated"), "truncated"),
        (lambda d: d.update(points={}), "points"),
        (lambda d: d["points"][0].pop("ttfp_p95_ms"), "points\\[0\\].ttfp_p95_ms"),
        (lambda d: d["points"][0].update(c=1.5), "points\\[0\\].c"),
        (lambda d: d["points"][0].update(tput="fast"), "points\\[0\\].tput"),
        (lambda d: d["points"][0].update(arm="no arm"), "points\\[0\\].arm"),
        (lambda d: d.update(baseline=3), "baseline"),
    ],
)
def test_parser_refuses_invalid_messages(mutate: Any, needle: str) -> None:
    doc = base_doc(truncated=False)
    mutate(doc)
    with pytest.raises(TerminationMessageError, match=needle):
        parse_termination_message(json.dumps(doc))


@pytest.mark.parametrize("text", ["", "   ", "not json", "[]", "{" + " " * 5000 + "}"])
def test_parser_refuses_non_messages(text: str) -> None:
    with pytest.raises(TerminationMessageError):
        parse_termination_message(text)


def test_parser_ignores_unknown_keys_for_forward_compatibility() -> None:
    doc = base_doc(truncated=False, future_field={"x": 1})
    doc["points"][0]["future"] = 1
    assert parse_termination_message(json.dumps(doc))["future_field"] == {"x": 1}


def test_message_module_is_stdlib_only() -> None:
    import ast
    import sys

    source = termination.__file__
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    imported = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
