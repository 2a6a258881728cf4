"""Each engine mode (precision, solver steps) at each concurrency, in one run: throughput,
first audio, peak memory and graph captures from the closed loop of ``engine_bench``, and
fidelity against the fp32 engine from ``fidelity``, on the same random weights and voices.

Every engine is freed before the next is built. Rows (``rows`` in the JSON): ``mode``,
``precision``, ``n_timesteps``, ``concurrency``, ``audio_s_per_s``, ``first_audio_p95_ms``,
``peak_mem_gib``, ``flow_snr_db``, ``mel_snr_db``, ``pcm_snr_db``, ``captures_after_warmup``;
the fidelity figures are per mode (``--fidelity-voices`` whole streams at up to 32 at once).
The PNG plots audio-s/s and peak memory against C for each mode.

Usage::

    python -m minicpm_speech_runtime.bench.precision_bench --generate real \\
        --campplus-onnx .bench-assets/campplus.onnx --conc 32,64,128 \\
        --mode fp32: --mode bf16-cache:precision=bf16-cache --mode steps5:n_timesteps=5 \\
        --json runtime/bench-results/precision-h200-REV.json --png ...png
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..assets import load_code2wav
from ..engine import EngineConfig
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from .engine_bench import bench_voices, finish_plot, matmul_peak, run_engine
from .fidelity import fidelity, json_safe, parse_candidate
from .parity import utterance

ROW_FIELDS = ("mode", "precision", "n_timesteps", "concurrency", "audio_s_per_s",
              "first_audio_p95_ms", "peak_mem_gib", "flow_snr_db", "mel_snr_db", "pcm_snr_db",
              "captures_after_warmup")


def rows_of(mode: str, overrides: dict[str, Any], runs: dict[int, dict[str, Any]],
            figures: dict[str, Any]) -> list[dict[str, Any]]:
    cfg = EngineConfig(**overrides)
    return [{
        "mode": mode, "precision": cfg.precision, "n_timesteps": cfg.n_timesteps,
        "concurrency": c, "audio_s_per_s": r["audio_s_per_s"],
        "first_audio_p95_ms": r["first_audio_p95_ms"], "peak_mem_gib": r["peak_mem_gib"],
        "flow_snr_db": figures["flow_snr_db"], "mel_snr_db": figures["mel_snr_db"],
        "pcm_snr_db": figures["pcm_snr_db"],
        "captures_after_warmup": r["cuda_graph_captures_after_warmup"],
    } for c, r in sorted(runs.items())]


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'mode':14} {'C':>4} {'audio-s/s':>10} {'first p95 ms':>13} {'peak GiB':>9} "
            f"{'flow SNR':>9} {'mel SNR':>8} {'PCM SNR':>8} {'captures':>9}")
    lines = [head]
    for r in rows:
        p95 = r["first_audio_p95_ms"]
        lines.append(
            f"{r['mode']:14} {r['concurrency']:4d} {r['audio_s_per_s']:10.1f} "
            f"{(p95 if p95 is not None else float('nan')):13.0f} {r['peak_mem_gib']:9.2f} "
            f"{r['flow_snr_db']:9.2f} {r['mel_snr_db']:8.2f} {r['pcm_snr_db']:8.2f} "
            f"{r['captures_after_warmup']:9d}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        cs = [r["concurrency"] for r in mine]
        ax[0].plot(cs, [r["audio_s_per_s"] for r in mine], "o-", label=mode)
        ax[1].plot(cs, [r["peak_mem_gib"] for r in mine], "o-", label=mode)
    finish_plot(fig, ax, title, path, names=("audio-s per s", "peak GPU memory (GiB)"),
                log_y=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--generate", choices=("real", "tiny"), default="real")
    p.add_argument("--campplus-onnx", type=Path, default=None)
    p.add_argument("--conc", default="32,64,128")
    p.add_argument("--window", type=float, default=8.0)
    p.add_argument("--voices", type=int, default=16)
    p.add_argument("--fidelity-voices", type=int, default=32)
    p.add_argument("--fidelity-tokens", type=int, default=250)
    p.add_argument("--mode", action="append", default=[], type=parse_candidate,
                   help="name:EngineConfig overrides, e.g. bf16-cache:precision=bf16-cache")
    p.add_argument("--graphs", choices=("on", "off"), default="on")
    p.add_argument("--git-rev", default="")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--png", type=Path)
    a = p.parse_args(argv)
    modes = dict(a.mode) or {"fp32": {}}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = tempfile.TemporaryDirectory()  # for the whole run: the speaker model loads from it
    write_random_checkpoint(ckpt.name, REAL if a.generate == "real" else TINY,
                            campplus_onnx=a.campplus_onnx)
    models = load_code2wav(ckpt.name, device)
    voices = bench_voices(models, max(a.voices, a.fidelity_voices))
    # the DiT's roofline figure only; 4096^3 matmuls would take a CPU most of a minute
    peak = matmul_peak()["tf32_tflops"] if device == "cuda" else 1.0
    concs = [int(c) for c in a.conc.split(",") if c]
    fid_streams = min(32, a.fidelity_voices)
    figures = {f["candidate"]: f for f in fidelity(
        models, voices[: a.fidelity_voices],
        [utterance(a.fidelity_tokens, 100 + i) for i in range(a.fidelity_voices)],
        modes, {"max_streams": fid_streams, "micro_batch": min(8, fid_streams)},
    )}
    rows: list[dict[str, Any]] = []
    for mode, overrides in modes.items():
        runs = {c: run_engine(models, voices[: a.voices], c, a.window, peak, a.graphs == "on",
                              True, **overrides) for c in concs}
        rows += rows_of(mode, overrides, runs, figures[mode])
    print(table(rows))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = {"git_rev": a.git_rev, "device": name, "dims": a.generate, "voices": a.voices,
           "fidelity_voices": a.fidelity_voices, "fidelity_tokens": a.fidelity_tokens,
           "window_s": a.window, "modes": modes, "rows": rows}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(json_safe(out), indent=1) + "\n")
    if a.png:
        plot(rows, f"Code2Wav engine modes, {name}, {a.git_rev}", a.png)
    ckpt.cleanup()


if __name__ == "__main__":
    main()
