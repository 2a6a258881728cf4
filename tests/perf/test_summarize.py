"""Summaries from official-format result files: numbers, golden Markdown, plots, message."""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_perf.results import ResultFormatError
from minicpm_speech_perf.summarize import SummaryError, summarize, sweep_message
from perf_fixtures import synthetic_run, write
from PIL import Image

GOLDEN = Path(__file__).parent / "golden" / "summary.md"
HEADER = {
    "config_hash": "cfg-1a2b3c",
    "mode": "dedicated",
    "baseline": "A",
    "started": "2026-11-29T10:00:00Z",
    "finished": "2026-11-29T12:00:00Z",
    "status": "ok",
    "reason": "",
}
SCALE = {("A", 1): 1.0, ("A", 2): 0.96, ("B", 1): 1.12, ("B", 2): 1.08}


def build_sweep(root: Path, *, with_manifest: bool) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """A and B, C1 and C8, two visits x two measured runs; B.2 at C8 had 3 failed requests."""
    docs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    visits = []
    for arm, index in (("A", 1), ("B", 1), ("B", 2), ("A", 2)):
        runs = []
        for c in (1, 8):
            for rep in (1, 2):
                failed = 3 if (arm, index, c, rep) == ("B", 2, 8, 1) else 0
                doc = synthetic_run(c, scale=SCALE[(arm, index)] + 0.01 * rep, failed=failed)
                name = f"{arm}.{index}-c{c}-measured{rep}.json"
                write(root / "results" / name, doc)
                docs.setdefault((arm, c), []).append(doc)
                peak = 70000.0 + 1000 * index + 10 * c + (500 if arm == "B" else 0)
                runs.append({"name": name[:-5], "kind": "measured", "concurrency": c,
                             "result": f"results/{name}", "exit_code": 0,
                             "gpu_memory": {"available": True, "peak_mib": peak}})  # fmt: skip
            write(root / "results" / f"{arm}.{index}-c{c}-discard.json", synthetic_run(c))
        visits.append({"arm": arm, "index": index, "runs": runs})
    if with_manifest:
        manifest = HEADER | {"visits": visits}
        (root / "manifest.json").write_text(json.dumps(manifest))
    return docs


def test_points_computed_from_the_measured_runs(tmp_path: Path) -> None:
    docs = build_sweep(tmp_path, with_manifest=True)
    summary = summarize(tmp_path)
    points = {(p["arm"], p["concurrency"]): p for p in summary["points"]}
    assert list(points) == [("A", 1), ("A", 8), ("B", 1), ("B", 8)]
    for key, runs in docs.items():
        p = points[key]
        tputs = [d["audio_throughput"] for d in runs]
        assert p["runs"] == 4
        assert p["audio_tput"] == pytest.approx(fmean(tputs))
        assert (p["audio_tput_min"], p["audio_tput_max"]) == (min(tputs), max(tputs))
        n = [d["num_audio_ttfp_samples"] for d in runs]
        means = [d["mean_audio_ttfp_ms"] for d in runs]
        weighted = sum(m * k for m, k in zip(means, n, strict=True)) / sum(n)
        assert p["ttfp_ms"] == pytest.approx(weighted)
        assert p["ttfp_p95_ms"] == pytest.approx(fmean(d["p95_audio_ttfp_ms"] for d in runs))
        assert p["req_tput"] == pytest.approx(fmean(d["request_throughput"] for d in runs))
    assert (points[("B", 8)]["ok"], points[("B", 8)]["total"]) == (253, 256)
    assert (points[("A", 8)]["ok"], points[("A", 8)]["total"]) == (256, 256)
    assert points[("B", 8)]["peak_mib"] == 72580.0
    assert [r["concurrency"] for r in summary["comparison"]] == [1, 8]
    assert summary["comparison"][0]["audio_tput_change"] > 0.05


def test_discarded_and_warmup_runs_are_ignored(tmp_path: Path) -> None:
    build_sweep(tmp_path, with_manifest=False)
    write(tmp_path / "results" / "A.1-warmup.json", synthetic_run(16, n=16))
    summary = summarize(tmp_path, HEADER)
    assert all(p["runs"] == 4 for p in summary["points"])
    assert all(p["peak_mib"] is None for p in summary["points"])  # no manifest: no NVML data


def test_golden_markdown(tmp_path: Path) -> None:
    build_sweep(tmp_path, with_manifest=True)
    summarize(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_plots_open_and_hold_the_expected_series(tmp_path: Path) -> None:
    build_sweep(tmp_path, with_manifest=True)
    summary = summarize(tmp_path)
    drawn = json.loads((tmp_path / "plots.json").read_text())
    for png, attr in (("throughput.png", "audio_tput"), ("first_audio_latency.png", "ttfp_ms")):
        with Image.open(tmp_path / png) as img:
            img.verify()
        with Image.open(tmp_path / png) as img:
            assert img.format == "PNG" and img.size == (700, 450)
        lines = {line["label"]: line for line in drawn[png]["lines"]}
        assert sorted(lines) == ["A", "B"]
        for arm in ("A", "B"):
            pts = [p for p in summary["points"] if p["arm"] == arm]
            assert lines[arm]["x"] == [1.0, 8.0]
            assert lines[arm]["y"] == pytest.approx([p[attr] for p in pts])
    bands = drawn["throughput.png"]["bands"]["B"]
    pts = [p for p in summary["points"] if p["arm"] == "B"]
    assert bands["lo"] == [p["audio_tput_min"] for p in pts]
    assert bands["hi"] == [p["audio_tput_max"] for p in pts]


def test_bad_result_file_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    build_sweep(tmp_path, with_manifest=True)
    bad = tmp_path / "results" / "B.1-c8-measured2.json"
    doc = json.loads(bad.read_text())
    del doc["p95_audio_ttfp_ms"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ResultFormatError) as err:
        summarize(tmp_path)
    assert err.value.path == str(bad) and err.value.key == "p95_audio_ttfp_ms"


def test_no_measured_runs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    with pytest.raises(SummaryError, match="no measured"):
        summarize(tmp_path, HEADER)


def test_sweep_message_round_trips(tmp_path: Path) -> None:
    from minicpm_speech_perf.summarize import Point

    build_sweep(tmp_path, with_manifest=True)
    points = [Point(**p) for p in summarize(tmp_path)["points"]]
    text = sweep_message(HEADER, points)
    msg = parse_termination_message(text)
    assert msg["kind"] == "sweep" and msg["hash"] == "cfg-1a2b3c" and msg["baseline"] == "A"
    assert [(p["arm"], p["c"]) for p in msg["points"]] == [("A", 1), ("A", 8), ("B", 1), ("B", 8)]
    b8 = msg["points"][3]
    assert (b8["ok"], b8["n"]) == (253, 256)
    assert b8["tput"] == pytest.approx(points[3].audio_tput, rel=1e-3)
    assert not msg["truncated"]


def test_cli_summarize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from minicpm_speech_perf.cli import main

    build_sweep(tmp_path, with_manifest=True)
    tlog = tmp_path / "tlog"
    assert main(["summarize", "--artifacts", str(tmp_path), "--termination-log", str(tlog)]) == 0
    msg = parse_termination_message(tlog.read_text())
    assert msg == json.loads(capsys.readouterr().out)
    assert len(msg["points"]) == 4

    bad = tmp_path / "results" / "A.2-c1-measured1.json"
    bad.write_text(bad.read_text().replace('"audio_throughput"', '"audio_tput"'))
    assert main(["summarize", "--artifacts", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "'audio_throughput'" in err


def test_malformed_manifest_is_named(tmp_path: Path) -> None:
    build_sweep(tmp_path, with_manifest=True)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["visits"][0]["runs"][0]["result"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SummaryError, match=r"manifest\.json: malformed"):
        summarize(tmp_path)
