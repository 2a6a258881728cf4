"""Side-by-side closed-loop runs of engine variants, each in a process of its own.

A variant is a source tree (any revision's ``runtime`` folder, e.g. from ``git worktree add``)
and optional ``EngineConfig`` overrides. Every run loads the models afresh and measures the
benchmark's steady-state loop at one concurrency (``engine_bench.run_engine``). One engine's
figure moved by ~2 % between runs on freshly started machines, so a change worth a few percent
is only seen side by side on one machine; variants run in alternating order, round after round
(A B B A ...), so drift during a run (clocks, heat) falls on both; and a process per run
keeps one variant's memory and graphs from shaping the next. Prints a table and writes JSON.

Usage (two revisions at 64 streams, two rounds)::

    git worktree add /tmp/base <rev>
    python -m minicpm_speech_runtime.bench.engine_ab --generate real \
        --campplus-onnx .bench-assets/campplus.onnx --conc 64 --window 6 --rounds 2 \
        --variant base=/tmp/base/runtime --variant head=runtime \
        --set head:setup_cache_mib=0 --json /tmp/ab.json

This file runs twice: as the parent (``-m``), and by path as each run's child, where
``minicpm_speech_runtime`` resolves to the variant's tree; so it imports that package only
inside functions, and only what every revision of the benchmark has.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "AB-RESULT "
REPORTED = ("audio_s_per_s", "first_audio_p95_ms", "chunk_p50_ms", "chunk_p95_ms", "peak_mem_gib")


@dataclass(slots=True)
class Variant:
    name: str
    tree: Path  # holds the ``minicpm_speech_runtime`` package
    overrides: dict[str, Any] = field(default_factory=dict)


def parse_variants(specs: list[str], sets: list[str], here: Path) -> list[Variant]:
    """``NAME=TREE`` (TREE relative to the working directory; ``NAME`` alone: this tree) and
    ``NAME:FIELD=VALUE`` overrides (VALUE as JSON, else a string)."""
    variants: dict[str, Variant] = {}
    for spec in specs:
        name, _, tree = spec.partition("=")
        if not name or name in variants:
            raise SystemExit(
                f"--variant {spec!r}: each variant needs a name of its own (NAME=TREE)"
            )
        path = Path(tree).resolve() if tree else here
        if not (path / "minicpm_speech_runtime" / "bench" / "engine_bench.py").is_file():
            raise SystemExit(
                f"--variant {spec!r}: {path} holds no minicpm_speech_runtime package with a "
                "benchmark; give the folder that contains it (a revision's runtime/)"
            )
        variants[name] = Variant(name, path)
    if len(variants) < 2:
        raise SystemExit("give at least two --variant NAME=TREE to compare")
    for item in sets:
        target, _, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if target not in variants or not key or not eq:
            raise SystemExit(f"--set {item!r}: expected VARIANT:FIELD=VALUE for a named variant")
        try:
            variants[target].overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            variants[target].overrides[key] = value
    return list(variants.values())


def run_order(names: list[str], rounds: int) -> list[str]:
    """Every variant once per round, each round in the reverse order of the one before."""
    return [n for r in range(rounds) for n in (names if r % 2 == 0 else names[::-1])]


def summarise(runs: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        ok = [r for r in runs if r["variant"] == name and "audio_s_per_s" in r]
        row: dict[str, Any] = {"variant": name, "runs": len(ok)}
        if ok:
            speeds = [r["audio_s_per_s"] for r in ok]
            row.update(min=min(speeds), max=max(speeds))
            for key in REPORTED:  # a latency is None when no stream started in the window
                seen = [r[key] for r in ok if r.get(key) is not None]
                row[key] = statistics.fmean(seen) if seen else None
        rows.append(row)
    first = rows[0].get("audio_s_per_s")
    for row in rows:
        if first and row.get("audio_s_per_s") is not None:
            row["vs_first"] = row["audio_s_per_s"] / first
    return rows


def _child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_variant(v: Variant, checkpoint: Path, a: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--checkpoint", str(checkpoint),
        "--conc", str(a.conc),
        "--window", str(a.window),
        "--voices", str(a.voices),
        "--overrides", json.dumps(v.overrides),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=_child_env(v.tree), capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return {"variant": v.name, **json.loads(line[len(RESULT_PREFIX) :])}
    return {"variant": v.name, "error": (done.stderr or done.stdout)[-2000:]}


def child(a: argparse.Namespace) -> None:
    """One run in the variant's tree: load, build the engine with the overrides, measure."""
    import dataclasses

    import numpy as np
    import torch

    from minicpm_speech_runtime.assets import load_code2wav
    from minicpm_speech_runtime.bench import engine_bench
    from minicpm_speech_runtime.bench.parity import make_voices

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = load_code2wav(a.checkpoint, dev)
    # engine_bench's voices, built here: older trees have no ``bench_voices``
    rng = np.random.default_rng(0)
    voices = make_voices(models, [float(s) for s in rng.uniform(3.0, 10.0, a.voices)])
    built: list[Any] = []
    plain = engine_bench.EngineConfig

    def config(**kwargs: Any) -> Any:
        cfg = plain(**{**kwargs, **json.loads(a.overrides)})
        built.append(cfg)
        return cfg

    # run_engine builds its EngineConfig by this module-level name in every revision
    vars(engine_bench)["EngineConfig"] = config
    res = engine_bench.run_engine(models, voices, a.conc, a.window, 1.0, True, True)
    out = {k: res[k] for k in REPORTED} | {
        "kernels_fused": res.get("kernels_fused"),
        "graphs": res.get("graphs"),
        "config": dataclasses.asdict(built[-1]),
    }
    print(RESULT_PREFIX + json.dumps(out, default=str), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description="engine variants side by side, one process each")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--variant", action="append", default=[], help="NAME=TREE")
    p.add_argument("--set", action="append", default=[], help="VARIANT:FIELD=VALUE")
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--generate", choices=["tiny", "real"])
    p.add_argument("--campplus-onnx", type=Path)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/engine-ab"))
    p.add_argument("--conc", type=int, default=64)
    p.add_argument("--window", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--voices", type=int, default=16)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.child:
        child(a)
        return
    if a.conc < 1 or a.rounds < 1 or a.window <= 0:
        raise SystemExit("--conc and --rounds must be >= 1 and --window > 0")
    here = Path(__file__).resolve().parents[2]
    variants = parse_variants(a.variant, a.set, here)
    checkpoint = a.checkpoint
    if checkpoint is None:
        if a.generate is None:
            raise SystemExit("give --checkpoint DIR or --generate tiny|real")
        from minicpm_speech_runtime.fixtures.checkpoint import REAL, TINY, write_random_checkpoint

        dims = REAL if a.generate == "real" else TINY
        checkpoint = write_random_checkpoint(a.workdir / "ckpt", dims, 0, a.campplus_onnx)
    by_name = {v.name: v for v in variants}
    runs = []
    for name in run_order(list(by_name), a.rounds):
        runs.append(run_variant(by_name[name], checkpoint, a))
        r = runs[-1]
        print(f"{name:>12} {r.get('audio_s_per_s', float('nan')):8.1f} {r.get('error', '')[-300:]}")
    table = summarise(runs, list(by_name))
    print(f"{'variant':>12} {'runs':>4} {'audio-s/s':>10} {'min':>7} {'max':>7} {'vs first':>8}")
    for row in table:
        nan = float("nan")
        print(
            f"{row['variant']:>12} {row['runs']:>4} {row.get('audio_s_per_s', nan):10.1f} "
            f"{row.get('min', nan):7.1f} {row.get('max', nan):7.1f} {row.get('vs_first', nan):8.3f}"
        )
    doc = {
        "conc": a.conc,
        "window_s": a.window,
        "order": [r["variant"] for r in runs],
        "variants": [
            {"name": v.name, "tree": str(v.tree), "overrides": v.overrides} for v in variants
        ],
        "summary": table,
        "runs": runs,
    }
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
