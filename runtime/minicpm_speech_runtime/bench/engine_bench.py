"""Batched Code2Wav engine vs the reference's per-stream streaming, closed loop, one device.

Stages, each recorded in the JSON (a failing stage is recorded and the rest still run):

* ``parity``: engine vs ``Token2wav.stream`` (driven per stream, own cache buffers), fp32 with
  TF32 off, HiFT's random NSF draws fixed to zero on both sides; mixed voices/lengths, a stream
  past the history window, streams joining mid-flight. Max abs PCM difference per stream. With
  ``--graphs on`` the engine precaptures its grid first and replays graphs (stats recorded).
* ``matmul_peak``: TF32 and fp32 4096^3 matmul rate, the roofline's ceiling.
* ``engine``: for each C, C streams, each with its own voice (3-10 s random-waveform reference,
  prepared before the loop, by voice preparation) and 250 tokens pushed the way vLLM-Omni's
  stage-1 hook sends them, a first window of 28 (a chunk and its 3 lookahead tokens) and then 25
  new tokens per step; a finished stream is replaced at once. Measured in steady state: during
  warm-up streams start at most C/10 per step until C are live, then run one more utterance, so
  streams start and end at staggered steps as requests of varying length do (with every
  utterance the same length, a simultaneous start would repeat as a burst of C cold setups
  every 10 steps; the burst is measured on its own, ``setup_burst_32``). Audio-s/s over the
  window, first audio (add_stream -> first PCM, streams started in the window), chunk latency
  (push -> PCM), peak memory, DiT FLOP rate vs the matmul peak, graph counters (captures during
  warm-up, captures after it: must be 0, replays, refusals, eager runs).
* ``reference``: C streams started together through the reference, one stream's chunk at a
  time (its steady state would take minutes per C to reach).

Usage::

    python -m minicpm_speech_runtime.bench.engine_bench --generate real \
        --campplus-onnx .bench-assets/campplus.onnx --git-rev "$(git rev-parse HEAD)" \
        --json runtime/bench-results/engine-h200.json --png runtime/bench-results/engine-h200.png
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import platform
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ..assets import Code2WavModels, load_code2wav
from ..engine import Code2WavEngine
from ..engine import EngineConfig as EngineConfig  # engine_ab replaces it by this name
from ..engine.config import HISTORY_FRAMES
from ..engine.workspace import use_serving_allocator
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from .parity import drain, fixed_nsf_noise, make_voices, max_diff, reference_chunks, utterance
from .reference_driver import ReferenceDriver

if TYPE_CHECKING:
    from ..engine.estimator import CausalConditionalCFM

SR = 24000
# The runs behind the published figures: a graph for every decode and setup shape up to C64.
BENCH_GRAPH_BUDGET = 64
OPTIONAL_STAGES = {"parity", "burst"}  # a comparison run of throughput can leave these out
UTT_TOKENS, PIECE, FIRST_WINDOW = 250, 25, 28


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    gc.collect()  # an earlier stage's engine (graph closures make cycles) must not count here
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def new_engine(models: Code2WavModels, cfg: EngineConfig) -> Code2WavEngine:
    """An engine built only once the last one is gone: its graph closures make reference
    cycles, which keep its slots' caches and graph pools until a collection. A C128 engine
    built while the C64 one still held 115 GiB did not fit on the H200."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return Code2WavEngine(models, cfg)


def _peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def parity(models: Code2WavModels, voices: list[Any], graphs: bool, fused: bool) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    plan = [("a", 0, 260, 0), ("b", 1, 77, 0), ("c", 2, 130, 1), ("d", 0, 53, 2)]
    with fixed_nsf_noise():
        driver = ReferenceDriver(models)
        want = {
            s: reference_chunks(driver, s, voices[v], utterance(n, i))
            for i, (s, v, n, _) in enumerate(plan)
        }
        del driver
        cfg = EngineConfig(
            max_streams=4, micro_batch=4, tf32=False, cuda_graphs=graphs, fused_kernels=fused
        )
        eng = new_engine(models, cfg)
        eng.warmup()
        got: dict[Any, list[np.ndarray]] = {}
        reasons: dict[Any, str] = {}
        for step in drain(eng, got, reasons, min_steps=3):
            for i, (s, v, n, at) in enumerate(plan):
                if at == step:
                    eng.add_stream(s, voices[v])
                    eng.push_tokens(s, utterance(n, i), last=True)
    diffs = {s: max_diff(want[s], got[s]) for s, *_ in plan}
    return {
        "kernels_fused": eng.runner.kernels.fused,
        "kernels_unfused_because": eng.runner.kernels.unfused_because,
        "max_abs_diff": diffs,
        "worst": max(diffs.values()),
        "pass_1e-4": max(diffs.values()) <= 1e-4,
        "graphs": eng.graph_stats(),
    }


def matmul_peak() -> dict[str, float]:
    out = {}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
    for name, tf32 in (("tf32", True), ("fp32", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for _ in range(3):
            a @ b
        _sync()
        t0 = time.perf_counter()
        for _ in range(20):
            a @ b
        _sync()
        out[f"{name}_tflops"] = 20 * 2 * 4096**3 / (time.perf_counter() - t0) / 1e12
    return out


def dit_flops_per_chunk(models: Code2WavModels, frames: int, keys: int) -> float:
    """DiT FLOPs of one stream's ``frames`` new frames attending to ``keys`` cached ones:
    10 steps x 2 CFG rows x (per-frame linear layers and convs + attention). The adaLN and
    timestep-embedding layers run once per step whatever the frames (the engine computes them
    at start-up), so they are not per-frame work."""
    est = cast("CausalConditionalCFM", models.flow.decoder).estimator
    lin = sum(
        m.weight.numel()
        for name, m in est.named_modules()
        if isinstance(m, torch.nn.Linear)
        and "adaLN_modulation" not in name
        and "t_embedder" not in name
    )
    blk = est.blocks[0]
    conv = 2 * cast(torch.nn.Conv1d, blk.conv.block[1]).weight.numel()
    attn = 4 * blk.attn.num_heads * blk.attn.head_dim * keys * len(est.blocks)
    return 10 * 2 * frames * (2 * (lin + conv * len(est.blocks)) + attn)


class Loop:
    """The closed-loop client: C live streams, each 250 tokens pushed 28, then 25 per step.
    ``prefix`` goes before each stream's tokens: vLLM-Omni's connector starts every stream
    with 3 silence codes, which shifts its last chunk from a 25-token one (batched with the
    continuing chunks) to a 28-token one (a one-row HiFT graph each)."""

    def __init__(self, voices: list[Any], conc: int, prefix: tuple[int, ...] = ()) -> None:
        self.voices, self.conc, self.next = voices, conc, 0
        self.prefix, self.total = list(prefix), len(prefix) + UTT_TOKENS
        self.sent: dict[int, int] = {}
        self.start: dict[int, float] = {}
        self.pushed: dict[int, float] = {}
        self.first: list[float] = []
        self.chunk: list[float] = []
        self.samples = 0
        self.window_start = 0
        # arrived streams the engine has no cache frames for yet; their first audio counts
        # the wait
        self.waiting: collections.deque[tuple[int, Any]] = collections.deque()

    def new_stream(self) -> tuple[int, Any]:
        sid = self.next
        self.next += 1
        self.sent[sid], self.start[sid] = 0, time.perf_counter()
        return sid, cold(self.voices[sid % len(self.voices)], sid)

    def piece(self, sid: int) -> tuple[list[int], bool]:
        n = PIECE if self.sent[sid] else FIRST_WINDOW
        toks = (self.prefix + utterance(UTT_TOKENS, sid))[self.sent[sid] : self.sent[sid] + n]
        self.sent[sid] += len(toks)
        self.pushed[sid] = time.perf_counter()
        return toks, self.sent[sid] >= self.total

    def got(self, sid: int, samples: int) -> None:
        now = time.perf_counter()
        if sid in self.start:
            self.first.append(now - self.start.pop(sid))
        self.chunk.append(now - self.pushed[sid])
        self.samples += samples

    def reset_stats(self) -> None:
        """A new measurement window: live streams go on; only streams started from now count
        for first audio."""
        self.start.clear()
        self.first, self.chunk, self.samples = [], [], 0
        self.window_start = self.next

    def summary(self, wall: float) -> dict[str, Any]:
        return {
            "audio_s_per_s": self.samples / SR / wall,
            "first_audio_p50_ms": _ms(_pct(self.first, 50)),
            "first_audio_p95_ms": _ms(_pct(self.first, 95)),
            "chunk_p50_ms": _ms(_pct(self.chunk, 50)),
            "chunk_p95_ms": _ms(_pct(self.chunk, 95)),
            "streams_started": self.next - self.window_start,
            "first_audio_samples": len(self.first),
            "window_s": wall,
        }


def cold(voice: Any, sid: int) -> Any:
    """The voice under a key of its own: the engine sets it up from scratch (no cache, no share)."""
    return dataclasses.replace(voice, key=f"{voice.key}#{sid}")


def setup_burst(
    models: Code2WavModels,
    voices: list[Any],
    n: int,
    fused: bool,
    around_last: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, Any]:
    """``n`` cold voices arriving together: the step that sets them all up, timed (three
    runs; ``around_last`` wraps the last one, e.g. in a profiler)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg = EngineConfig(max_streams=n, micro_batch=min(8, n), graph_budget=BENCH_GRAPH_BUDGET,
                       setup_cache_mib=0, fused_kernels=fused)
    eng = new_engine(models, cfg)
    eng.warmup()
    res: dict[str, Any] = {"voices": n, "micro_batch": cfg.micro_batch, "runs_ms": []}
    for rep in range(3):
        for i in range(n):
            eng.add_stream((rep, i), cold(voices[i % len(voices)], 1000 * rep + i))
        plan = eng.scheduler.plan(eng.clock(), n, eng.runner.setup_cache)
        res["group_frames"] = [sum(s.prompt_frames for s in g) for g in plan.setup_groups]
        _sync()
        with around_last() if rep == 2 else contextlib.nullcontext():
            t0 = time.perf_counter()
            eng.step()  # no tokens yet: the step is the setups alone
            _sync()
            res["runs_ms"].append((time.perf_counter() - t0) * 1e3)
        for i in range(n):
            eng.cancel((rep, i))
        eng.step()
    res["setup_ms"] = min(res["runs_ms"][1:])
    res["graphs"] = eng.graph_stats()
    return res


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def run_engine(
    models: Code2WavModels,
    voices: list[Any],
    conc: int,
    window: float,
    peak: float,
    graphs: bool,
    fused: bool,
    prefix: tuple[int, ...] = (),
    **overrides: Any,
) -> dict[str, Any]:
    """C streams in steady state; ``overrides`` are further ``EngineConfig`` fields."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    # every stream is a cold voice here, so the setup cache could only cost memory
    cfg = EngineConfig(**{
        "max_streams": conc,
        "micro_batch": min(8, conc),
        "graph_budget": BENCH_GRAPH_BUDGET,
        "cuda_graphs": graphs,
        "setup_cache_mib": 0,
        "fused_kernels": fused,
        **overrides,
    })
    eng = new_engine(models, cfg)
    _sync()
    t0 = time.perf_counter()
    eng.warmup()
    _sync()
    precapture_s = time.perf_counter() - t0
    loop, live = steady_loop(eng, voices, conc, prefix)
    _reset_peak()
    loop.reset_stats()
    t0 = time.perf_counter()
    chunks0, setups0 = eng.counters.chunks, eng.counters.setups
    _engine_loop(eng, loop, live, conc, seconds=window)
    wall = time.perf_counter() - t0
    res = loop.summary(wall)
    chunks = eng.counters.chunks - chunks0
    prompt = mean_prompt_frames(voices)
    flops = chunks * dit_flops_per_chunk(models, 50, prompt + HISTORY_FRAMES + 50)
    setups = eng.counters.setups - setups0
    setup_flops = setups * dit_flops_per_chunk(models, prompt, prompt)
    res.update(
        kernels_fused=eng.runner.kernels.fused,
        kernels_unfused_because=eng.runner.kernels.unfused_because,
        peak_mem_gib=_peak_gib(),
        estimator_cache_gib=eng.runner.estimator.nbytes / 2**30,
        dit_tflops=flops / wall / 1e12,
        dit_roofline_fraction=flops / wall / 1e12 / peak,
        # useful work only: a prompt's padding to its bucket and graph size is not counted
        dit_tflops_with_setup=(flops + setup_flops) / wall / 1e12,
        dit_roofline_fraction_with_setup=(flops + setup_flops) / wall / 1e12 / peak,
        slot_moves=eng.runner.slot_moves,
        precapture_s=precapture_s,
        graphs=eng.graph_stats(),
        cuda_graph_captures_after_warmup=eng.graph_stats()["captures_after_warmup"],
        cuda_graphs="on" if graphs else "off",
    )
    eng.runner.profile = True
    _engine_loop(eng, loop, live, conc, seconds=3.0)
    res["phase_s_profiled_3s"] = dict(eng.runner.phase_s)
    for sid in live:
        eng.cancel(sid)
    eng.step()
    del eng
    return res


def bench_voices(models: Code2WavModels, count: int) -> list[Any]:
    """The benchmark's voices: ``count`` random-waveform references of 3-10 s, the same ones
    every run (seed 0)."""
    seconds = np.random.default_rng(0).uniform(3.0, 10.0, count)
    return make_voices(models, [float(s) for s in seconds])


def mean_prompt_frames(voices: list[Any]) -> int:
    return int(np.mean([v.prompt_mels.shape[1] for v in voices]))


def steady_loop(
    eng: Code2WavEngine, voices: list[Any], conc: int, prefix: tuple[int, ...] = ()
) -> tuple[Loop, set[int]]:
    """The closed loop at ``conc`` streams, warmed up into its steady state (allocator, library
    heuristics): streams ramp up at most C/10 per step, then run one more utterance."""
    loop, live = Loop(voices, conc, prefix), set[int]()
    _engine_loop(eng, loop, live, conc, seconds=2.0, min_steps=22, ramp=-(-conc // 10))
    return loop, live


def _engine_loop(
    eng: Code2WavEngine,
    loop: Loop,
    live: set[int],
    conc: int,
    seconds: float,
    min_steps: int = 0,
    ramp: int | None = None,
) -> None:
    """Steps for ``seconds`` (and ``min_steps``); a stream ends, another starts. With ``ramp``,
    at most that many start per step until ``conc`` are live for the first time."""
    end, steps = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or steps < min_steps:
        steps += 1
        if len(live) == conc:
            ramp = None
        room = conc - len(live) - len(loop.waiting)
        for _ in range(room if ramp is None else min(room, ramp)):
            loop.waiting.append(loop.new_stream())
        while loop.waiting and eng.admits(loop.waiting[0][1]):
            sid, voice = loop.waiting.popleft()
            eng.add_stream(sid, voice)
            live.add(sid)
        for sid in live:
            toks, last = loop.piece(sid)
            if toks or last:
                eng.push_tokens(sid, toks, last)
        for o in eng.step():
            if o.pcm.numel():
                loop.got(o.stream_id, o.pcm.numel())
            if o.finished:
                live.discard(o.stream_id)


def run_reference(
    models: Code2WavModels, voices: list[Any], conc: int, window: float
) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    _reset_peak()
    driver = ReferenceDriver(models, steps_buffered=10)
    loop = Loop(voices, conc)
    live: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    end = t0 + window
    while time.perf_counter() < end:
        while len(live) < conc:
            sid, voice = loop.new_stream()
            driver.add(sid, voice)  # the reference's setup when the stream's chunk 0 comes
            live[sid] = []
        for sid in list(live):  # one stream's chunk at a time, round robin
            if time.perf_counter() >= end:
                break
            _ref_chunk(driver, loop, live, sid)
    wall = time.perf_counter() - t0
    res = loop.summary(wall)
    res["peak_mem_gib"] = _peak_gib()
    del driver
    return res


def _ref_chunk(driver: ReferenceDriver, loop: Loop, live: dict[int, list[int]], sid: int) -> None:
    buf = live[sid]
    toks, last = loop.piece(sid)
    buf.extend(toks)
    if len(buf) >= 28 and not last:
        wav = driver.stream(sid, buf[:28], False)
        del buf[:25]
    elif last:
        while len(buf) > 28:
            loop.got(sid, driver.stream(sid, buf[:28], False).shape[0])
            del buf[:25]
        wav = driver.stream(sid, buf, True)
        live.pop(sid)
        driver.remove(sid)
    else:
        return
    _sync()
    loop.got(sid, wav.shape[0])


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("engine", "reference"):
        rows = results.get(name, {})
        cs = sorted(
            int(c) for c in rows if isinstance(rows[c], dict) and "audio_s_per_s" in rows[c]
        )
        ax[0].plot(cs, [rows[str(c)]["audio_s_per_s"] for c in cs], "o-", label=name)
        ax[1].plot(cs, [rows[str(c)]["first_audio_p95_ms"] or np.nan for c in cs], "o-", label=name)
    finish_plot(fig, ax, f"Code2Wav engine vs reference, {results.get('device')}, "
                f"{results.get('date')}", path)


def finish_plot(
    fig: Any, ax: Any, title: str, path: Path,
    names: tuple[str, str] = ("audio-s per s", "first audio p95 (ms)"), log_y: bool = True,
) -> None:
    """Both panels (by default audio-s/s and first audio p95 against C, log-log), titled and
    saved."""
    for a, name in zip(ax, names, strict=True):
        a.set_xscale("log", base=2)
        if log_y:
            a.set_yscale("log")
        a.set_xlabel("concurrent streams (distinct voices)")
        a.set_title(name)
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description="batched Code2Wav engine benchmark")
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--generate", choices=["tiny", "real"])
    p.add_argument("--campplus-onnx", type=Path)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/engine-bench"))
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--png", type=Path)
    p.add_argument("--git-rev", default="unknown")
    p.add_argument("--conc", default="1,2,4,8,16,32,64")
    p.add_argument("--ref-conc", default="1,8,32")
    p.add_argument("--window", type=float, default=8.0)
    p.add_argument("--ref-window", type=float, default=12.0)
    p.add_argument("--voices", type=int, default=16)
    p.add_argument("--graphs", choices=["on", "off"], default="on")
    p.add_argument("--fused", choices=["on", "off"], default="on", help="Triton kernels")
    p.add_argument(
        "--skip", default="", help="stages to leave out: parity, burst (comma-separated)"
    )
    a = p.parse_args()
    use_serving_allocator()
    skip = {x for x in a.skip.split(",") if x}
    if not skip <= OPTIONAL_STAGES:
        p.error(f"--skip {a.skip!r}: stages that can be left out are {sorted(OPTIONAL_STAGES)}")
    fused = a.fused == "on"
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_revision": a.git_rev,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else platform.processor(),
        "command": "python -m minicpm_speech_runtime.bench.engine_bench "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
    }
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder = a.checkpoint
    if a.generate:
        folder = write_random_checkpoint(
            a.workdir / "ckpt", REAL if a.generate == "real" else TINY, 0, a.campplus_onnx
        )
    models = load_code2wav(folder, dev)
    voices = bench_voices(models, a.voices)
    res["voice_prompt_frames"] = [int(v.prompt_mels.shape[1]) for v in voices]
    graphs = a.graphs == "on"
    if "parity" not in skip:
        _stage(res, "parity", lambda: parity(models, voices[:3], graphs, fused))
    _stage(res, "matmul_peak", matmul_peak)
    if "burst" not in skip:
        _stage(res, "setup_burst_32", lambda: setup_burst(models, voices, 32, fused))
    peak = res.get("matmul_peak", {}).get("tf32_tflops", 1.0)
    res["engine"], res["reference"] = {}, {}
    for c in [int(x) for x in a.conc.split(",") if x]:
        _stage(
            res["engine"],
            str(c),
            cast(
                Callable[[], Any],
                lambda c=c: run_engine(models, voices, c, a.window, peak, graphs, fused),
            ),
        )
        _save(res, a.json)
    for c in [int(x) for x in a.ref_conc.split(",") if x]:
        _stage(
            res["reference"],
            str(c),
            cast(Callable[[], Any], lambda c=c: run_reference(models, voices, c, a.ref_window)),
        )
        _save(res, a.json)
    res["ratio_audio_s_per_s"] = {
        c: res["engine"][c]["audio_s_per_s"] / r["audio_s_per_s"]
        for c, r in res["reference"].items()
        if "audio_s_per_s" in r
        and "audio_s_per_s" in res["engine"].get(c, {})
        and r["audio_s_per_s"] > 0
    }
    _save(res, a.json)
    if a.png:

        def plot_stage() -> dict[str, Any]:
            plot(res, a.png)
            return {}

        _stage(res, "plot", plot_stage)
    _table(res)


def _stage(res: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        res[name] = fn()
    except Exception as exc:  # recorded; the other stages still run
        res[name] = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    if isinstance(res[name], dict):
        res[name]["stage_s"] = time.perf_counter() - t0
    print(f"[{name}] {time.perf_counter() - t0:.1f}s", flush=True)


def _save(res: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2, default=str))


def _table(res: dict[str, Any]) -> None:
    print(json.dumps(res.get("parity"), default=str))
    print(json.dumps(res.get("matmul_peak"), default=str))
    burst = res.get("setup_burst_32", {})
    print("32 cold voices set up in one step:", _fmt(burst.get("setup_ms")), "ms")
    keys = (
        "audio_s_per_s",
        "first_audio_p50_ms",
        "first_audio_p95_ms",
        "chunk_p50_ms",
        "chunk_p95_ms",
        "peak_mem_gib",
    )
    print(f"{'who':<10}{'C':>4} " + " ".join(f"{k:>20}" for k in keys))
    for who in ("engine", "reference"):
        for c, r in res.get(who, {}).items():
            if isinstance(r, dict) and "error" not in r:
                print(f"{who:<10}{c:>4} " + " ".join(f"{_fmt(r.get(k)):>20}" for k in keys))
            elif isinstance(r, dict):
                print(f"{who:<10}{c:>4} ERROR {r['error'][:200]}")
    print("ratio", json.dumps(res.get("ratio_audio_s_per_s"), default=str))


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


if __name__ == "__main__":
    main()
