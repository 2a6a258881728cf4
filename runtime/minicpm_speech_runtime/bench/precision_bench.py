"""Each engine mode (precision, solver steps) at each concurrency, in one run: throughput,
first audio, peak memory and graph captures from the closed loop of ``engine_bench``, and
fidelity against the fp32 engine from ``fidelity``, on the same random weights and voices.

Every engine is freed before the next is built. Rows (``rows`` in the JSON): ``mode``,
``precision``, ``n_timesteps``, ``concurrency``, ``audio_s_per_s``, ``first_audio_p95_ms``,
``peak_mem_gib``, ``flow_snr_db``, ``mel_snr_db``, ``pcm_snr_db``, ``captures_after_warmup``,
``cache_mib``, ``estimator_cache_gib``, and the worst stream's log-mel SNR and the worst log-mel
L1 (``worst_stream_mel_snr_db``, ``worst_mel_l1``);
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
from typing import Any, cast

import torch
from minicpm_speech_contract.extras import PROMPT_FRAMES_PER_SECOND, cache_mib_for

from ..assets import Code2WavModels, load_code2wav
from ..engine import EngineConfig
from ..engine.runner import dit_dims
from ..engine.workspace import use_serving_allocator
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from .engine_bench import (
    bench_voices,
    finish_plot,
    matmul_peak,
    mean_prompt_frames,
    run_engine,
)
from .fidelity import fidelity, json_safe, parse_candidate
from .parity import utterance

ROW_FIELDS = ("mode", "precision", "n_timesteps", "concurrency", "audio_s_per_s",
              "first_audio_p95_ms", "peak_mem_gib", "flow_snr_db", "mel_snr_db", "pcm_snr_db",
              "captures_after_warmup", "cache_mib", "estimator_cache_gib",
              "worst_stream_mel_snr_db", "worst_mel_l1")


POOL_KEY = "pool_prompt_s"
CONC_KEY = "conc"
BENCH_KEYS = (POOL_KEY, CONC_KEY)  # the bench's own keys, not EngineConfig fields
MAX_CONC = 1024


def parse_mode(text: str) -> tuple[str, dict[str, Any]]:
    """A ``--mode``: :func:`~.fidelity.parse_candidate`'s ``name:key=value,...``, and
    ``pool_prompt_s=S`` (or ``=mean``) to size the key/value pool (``cache_mib``) for C
    streams of S-second prompts (of the bench voices' mean prompt) instead of the longest,
    and ``conc=64+128`` to run this mode at those of ``--conc`` only (fp32 at C128 does not
    fit an 80 GB card, while the other modes do)."""
    name, _, body = text.partition(":")
    items = body.split(",")
    mine = {k: [i.partition("=")[2] for i in items if i.startswith(k + "=")] for k in BENCH_KEYS}
    rest = ",".join(i for i in items if not i.startswith(BENCH_KEYS))
    name, overrides = parse_candidate(f"{name}:{rest}")
    if mine[POOL_KEY]:
        value = mine[POOL_KEY][-1]
        try:
            ok = value == "mean" or 0 < float(value) <= 60
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"--mode {text[:80]!r}: {POOL_KEY} is seconds (0-60] or 'mean'")
        overrides[POOL_KEY] = value
    if mine[CONC_KEY]:
        parts = mine[CONC_KEY][-1].split("+")
        if not all(p.isdigit() and 0 < int(p) <= MAX_CONC for p in parts):
            raise SystemExit(f"--mode {text[:80]!r}: {CONC_KEY} is concurrencies joined by '+' "
                             f"(1-{MAX_CONC}), e.g. {CONC_KEY}=64+128")
        overrides[CONC_KEY] = [int(p) for p in parts]
    return name, overrides


def mode_concurrencies(overrides: dict[str, Any], concs: list[int]) -> list[int]:
    """The concurrencies of ``--conc`` this mode runs at: all, or those its ``conc`` names."""
    wanted = overrides.get(CONC_KEY)
    return [c for c in concs if wanted is None or c in wanted]


def engine_overrides(overrides: dict[str, Any], models: Code2WavModels, streams: int,
                     voices: list[Any]) -> dict[str, Any]:
    """The mode's ``EngineConfig`` fields for ``streams`` streams of these voices: a pool
    sized by ``pool_prompt_s``, and never below one stream of the longest prompt."""
    fields = {k: v for k, v in overrides.items() if k not in BENCH_KEYS}
    if POOL_KEY in overrides:
        value = overrides[POOL_KEY]
        frames = (mean_prompt_frames(voices) if value == "mean"
                  else round(float(value) * PROMPT_FRAMES_PER_SECOND))
        cfg, dims = EngineConfig(**fields), dit_dims(cast(Any, models.flow))
        fields["cache_mib"] = max(
            cache_mib_for(n, f, cfg.n_timesteps, cfg.precision, *dims)
            for n, f in ((streams, frames), (1, cfg.max_prompt_frames)))
    return fields


def row_of(mode: str, concurrency: int, run: dict[str, Any],
           figures: dict[str, Any]) -> dict[str, Any]:
    """One ``rows`` entry: the closed loop at ``concurrency`` and the mode's fidelity."""
    cfg = run["config"]
    return {
        "mode": mode, "precision": cfg.precision, "n_timesteps": cfg.n_timesteps,
        "concurrency": concurrency, "audio_s_per_s": run["audio_s_per_s"],
        "first_audio_p95_ms": run["first_audio_p95_ms"], "peak_mem_gib": run["peak_mem_gib"],
        "flow_snr_db": figures["flow_snr_db"], "mel_snr_db": figures["mel_snr_db"],
        "pcm_snr_db": figures["pcm_snr_db"],
        "captures_after_warmup": run["cuda_graph_captures_after_warmup"],
        "cache_mib": cfg.cache_mib, "estimator_cache_gib": run["estimator_cache_gib"],
        "worst_stream_mel_snr_db": figures["worst_stream_mel_snr_db"],
        "worst_mel_l1": figures["worst_mel_l1"],
    }


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
    p.add_argument("--mode", action="append", default=[], type=parse_mode,
                   help="name:EngineConfig overrides, e.g. bf16-cache:precision=bf16-cache; "
                        "pool_prompt_s=S|mean sizes cache_mib for C streams of such prompts")
    p.add_argument("--graphs", choices=("on", "off"), default="on")
    p.add_argument("--git-rev", default="")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--png", type=Path)
    a = p.parse_args(argv)
    use_serving_allocator()
    modes = dict(a.mode) or {"fp32": {}}
    concs = [int(c) for c in a.conc.split(",") if c]
    for mode, overrides in modes.items():
        if not mode_concurrencies(overrides, concs):
            raise SystemExit(f"--mode {mode}: {CONC_KEY}={overrides[CONC_KEY]} names none of "
                             f"--conc {a.conc}; list them in --conc too")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = tempfile.TemporaryDirectory()  # for the whole run: the speaker model loads from it
    write_random_checkpoint(ckpt.name, REAL if a.generate == "real" else TINY,
                            campplus_onnx=a.campplus_onnx)
    models = load_code2wav(ckpt.name, device)
    voices = bench_voices(models, max(a.voices, a.fidelity_voices))
    # the DiT's roofline figure only; 4096^3 matmuls would take a CPU most of a minute
    peak = matmul_peak()["tf32_tflops"] if device == "cuda" else 1.0
    fid_streams = min(32, a.fidelity_voices)
    fid_voices = voices[: a.fidelity_voices]
    figures = {f["candidate"]: f for f in fidelity(
        models, fid_voices,
        [utterance(a.fidelity_tokens, 100 + i) for i in range(a.fidelity_voices)],
        {m: engine_overrides(o, models, fid_streams, fid_voices) for m, o in modes.items()},
        {"max_streams": fid_streams, "micro_batch": min(8, fid_streams)},
    )}
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = {"git_rev": a.git_rev, "device": name, "dims": a.generate, "voices": a.voices,
           "fidelity_voices": a.fidelity_voices, "fidelity_tokens": a.fidelity_tokens,
           "window_s": a.window, "modes": modes, "rows": []}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    for mode, overrides in modes.items():
        for c in mode_concurrencies(overrides, concs):
            fields = engine_overrides(overrides, models, c, voices[: a.voices])
            run = run_engine(models, voices[: a.voices], c, a.window, peak,
                             a.graphs == "on", True, **fields)
            run["config"] = EngineConfig(**fields)
            out["rows"].append(row_of(mode, c, run, figures[mode]))
            # each row as it lands: a sweep cut short by a time limit keeps what it measured
            print(table(out["rows"][-1:]).splitlines()[-1], flush=True)
            a.json.write_text(json.dumps(json_safe(out), indent=1) + "\n")
    print(table(out["rows"]))
    if a.png:
        plot(out["rows"], f"Code2Wav engine modes, {name}, {a.git_rev}", a.png)
    ckpt.cleanup()


if __name__ == "__main__":
    main()
