"""Where a batched engine step spends its time, part by part, on one device.

Times every precaptured graph (decode solves, setup solves, vocoder) by replaying it, the
encoder per stream, HiFT eager at several batch sizes, and lists the top kernels of one eager
decode solve and one eager setup solve. Prints a table and writes JSON.

Usage::

    python -m minicpm_speech_runtime.bench.engine_profile --generate real \
        --campplus-onnx .bench-assets/campplus.onnx --json /tmp/profile.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..assets import load_code2wav
from ..engine import Code2WavEngine, EngineConfig
from ..engine.graphs import GraphKey
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from .engine_bench import BENCH_GRAPH_BUDGET, new_engine
from .parity import make_voices, utterance


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn: Callable[[], Any], reps: int = 10) -> float:
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync()
    return (time.perf_counter() - t0) / reps * 1e3


def top_kernels(fn: Callable[[], Any], n: int = 12) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        _sync()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
        if dev_us and e.device_type.name == "CUDA":
            rows.append({"kernel": e.key[:90], "calls": e.count, "ms": dev_us / 1e3})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    return [{"total_kernel_ms": total, "kernels": sum(r["calls"] for r in rows)}, *rows[:n]]


def main() -> None:
    p = argparse.ArgumentParser(description="per-part timing of the batched Code2Wav engine")
    p.add_argument("--generate", choices=["tiny", "real"], default="real")
    p.add_argument("--campplus-onnx", type=Path)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/engine-profile"))
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--max-streams", type=int, default=64)
    p.add_argument("--fused", choices=["on", "off"], default="on", help="Triton kernels")
    p.add_argument(
        "--steady", type=int, default=64, help="closed-loop streams for the timeline (0: off)"
    )
    p.add_argument("--parts", choices=["on", "off"], default="on", help="time each part alone")
    p.add_argument("--burst", type=int, default=0, help="cold voices set up in one step (0: off)")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = REAL if a.generate == "real" else TINY
    folder = write_random_checkpoint(a.workdir / "ckpt", spec, 0, a.campplus_onnx)
    models = load_code2wav(folder, dev)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    voices = make_voices(models, [3.0, 6.5, 10.0])
    res = device_parts(models, a, voices, dev) if a.parts == "on" else {}
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if a.burst:
        res["burst"] = burst_timeline(models, a.burst, a.fused == "on")
    if a.steady:
        res["steady"] = steady_timeline(models, a.steady, a.fused == "on")
    a.json.write_text(json.dumps(res, indent=1, default=str))
    for k, v in res.items():
        if isinstance(v, list):
            print(f"== {k}")
            for r in v:
                print("  ", r)
        elif isinstance(v, dict):
            print(f"== {k}")
            for kk, vv in v.items():
                print(f"   {kk!s:28} {vv:.3f}" if isinstance(vv, float) else f"   {kk} {vv}")
        else:
            print(f"{k}: {v}")


def device_parts(
    models: Any, a: argparse.Namespace, voices: list[Any], dev: torch.device
) -> dict[str, Any]:
    """Graph replays, the encoder by stream count, HiFT eager, top kernels of each solve."""
    micro = min(8, a.max_streams)
    cfg = EngineConfig(max_streams=a.max_streams, micro_batch=micro,
                       graph_budget=BENCH_GRAPH_BUDGET, fused_kernels=a.fused == "on")
    eng = new_engine(models, cfg)
    t0 = time.perf_counter()
    eng.warmup()
    res: dict[str, Any] = {
        "kernels_fused": eng.runner.kernels.fused,
        "precapture_s": time.perf_counter() - t0,
        "graphs": {},
    }
    for key, replay in sorted(eng.runner.graphs.graphs.items()):
        res["graphs"][f"{key.kind}/{key.batch}/{key.frames}/{key.extra}"] = timed_ms(replay)

    # the batched encoder at steady cache length (prompt + 100 after the cut), n streams at once
    from ..engine.state import StreamState

    streams = []
    for i in range(a.max_streams):
        v = voices[i % len(voices)]
        st = StreamState(i, v, f"{v.key}#{i}", int(v.prompt_mels.shape[1]), i, 0.0)
        eng.runner.attach(st)
        streams.append(st)
    toks = torch.tensor(utterance(28, 0), dtype=torch.int32)
    res["encoder_chunk_ms"], res["encoder_prompt_ms"] = {}, {}
    with torch.inference_mode():
        prompts = [eng.runner._prompt_tokens(st) for st in streams]
        eng.runner._encode(streams, prompts, [False] * len(streams))
        for _ in range(6):
            eng.runner._encode(streams, [toks] * len(streams), [False] * len(streams))
        for n in sorted({1, 8, 32, a.max_streams}):
            if n <= a.max_streams:
                group = streams[:n]
                res["encoder_chunk_ms"][n] = timed_ms(
                    cast(
                        Callable[[], Any],
                        lambda g=group: eng.runner._encode(g, [toks] * len(g), [False] * len(g)),
                    )
                )
        group = streams[:8]
        res["encoder_prompt_ms"][len(group)] = timed_ms(lambda: _fresh_prompts(eng, group))
        mel = torch.randn(64, 80, 58, device=dev)
        src = torch.zeros(64, 1, 3840, device=dev)
        res["hift_eager_ms"] = {
            b: timed_ms(cast(Callable[[], Any], lambda b=b: models.hift(mel[:b], src[:b])), 5)
            for b in (1, 8, 32, 64)
        }
        solve = eng.runner.decode_solve
        key = GraphKey("decode", min(32, a.max_streams), 50)
        res["decode_eager_kernels"] = top_kernels(lambda: solve.est.solve(solve._views(key)))
        # a packed setup of real prompts: a replay of an idle graph attends to one trash key,
        # so the graph times above leave a setup's attention out (3840 frames on the H200:
        # 76.5 ms idle, 94.4 ms with 8 real prompts)
        ssolve = eng.runner.setup_solve
        lens = [int(voices[i % len(voices)].prompt_mels.shape[1]) for i in range(micro)]
        layout, skey = ssolve.layout(lens)
        mus = [torch.randn(80, n, device=dev) for n in lens]
        spks = [torch.randn(80, device=dev) for _ in lens]
        res["setup_real_ms"] = {
            "prompt_frames": lens,
            "width": layout.frames,
            "ms": timed_ms(lambda: ssolve.run(layout, skey, mus, mus, spks)),
        }
        res["setup_eager_kernels"] = top_kernels(
            lambda: ssolve.est.solve(ssolve._inputs(layout, mus, mus, spks))
        )
        res["encoder_kernels"] = top_kernels(
            lambda: eng.runner._encode(streams, [toks] * len(streams), [False] * len(streams))
        )
        res["hift32_kernels"] = top_kernels(lambda: models.hift(mel[:32], src[:32]))
    res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0
    return res


def steady_timeline(models: Any, conc: int, fused: bool, steps: int = 8) -> dict[str, Any]:
    """The benchmark's closed loop at ``conc`` streams, in steady state: wall time per step,
    device kernel time per step (the rest is the device waiting for the host), and where the
    host's time goes."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from .engine_bench import _engine_loop, bench_voices, steady_loop

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    voices = bench_voices(models, 16)
    cfg = EngineConfig(
        max_streams=conc, micro_batch=min(8, conc), graph_budget=BENCH_GRAPH_BUDGET,
        setup_cache_mib=0, fused_kernels=fused,
    )
    eng = new_engine(models, cfg)
    eng.warmup()
    loop, live = steady_loop(eng, voices, conc)
    _sync()
    t_plain = time.perf_counter()
    _engine_loop(eng, loop, live, conc, seconds=0.0, min_steps=steps)
    _sync()
    wall_plain = time.perf_counter() - t_plain
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        _engine_loop(eng, loop, live, conc, seconds=0.0, min_steps=steps)
        _sync()
        wall = time.perf_counter() - t0
    kernel_us = sum(
        e.device_time_total
        for e in prof.key_averages()
        if e.device_type.name == "CUDA" and e.device_time_total and not _annotation(e)
    )
    idle = device_idle_by_phase(prof.events(), steps)
    busy = device_kernels_by_phase(prof.events(), steps)
    prof_cpu = cProfile.Profile()
    prof_cpu.enable()
    t1 = time.perf_counter()
    _engine_loop(eng, loop, live, conc, seconds=0.0, min_steps=steps)
    _sync()
    wall_cprofile = time.perf_counter() - t1
    prof_cpu.disable()
    st = pstats.Stats(prof_cpu)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]  # type: ignore[attr-defined]
    host = [
        {"fn": f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}", "calls": v[1], "tottime_s": v[2]}
        for k, v in rows
    ]
    return {
        "streams": conc,
        "steps": steps,
        "wall_ms_per_step": wall_plain / steps * 1e3,
        "wall_ms_per_step_under_profiler": wall / steps * 1e3,
        "device_kernel_ms_per_step": kernel_us / 1e3 / steps,
        "device_kernel_ms_per_step_by_phase": busy,
        "device_idle_ms_per_step_by_host_phase": idle,
        "wall_ms_per_step_under_cprofile": wall_cprofile / steps * 1e3,
        "host_top_tottime": host,
    }


def burst_timeline(models: Any, n: int, fused: bool) -> dict[str, Any]:
    """The benchmark's burst (``n`` cold voices set up in one step) with its last run
    profiled: that step's kernel time and the device's idle time by phase."""
    from torch.profiler import ProfilerActivity, profile

    from .engine_bench import bench_voices, setup_burst

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=acts)
    res = setup_burst(models, bench_voices(models, 16), n, fused, around_last=lambda: prof)
    events = prof.events()  # type: ignore[no-untyped-call]
    res["profiled_ms"] = res["runs_ms"][-1]
    res["device_kernel_ms_by_phase"] = device_kernels_by_phase(events, 1)
    res["device_idle_ms_by_host_phase"] = device_idle_by_phase(events, 1)
    return res


def device_idle_by_phase(events: Any, steps: int) -> dict[str, float]:
    """The device's idle time per step, split by the engine phase the host was in when the
    device ran out of work (the innermost ``Runner.phase`` range open at the start of the gap;
    ``engine.step`` alone is step work outside any phase, ``outside`` is the caller's loop)."""
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type.name == "CUDA" and not _annotation(e)
    )
    ranges = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type.name == "CPU" and _annotation(e)
    ]
    idle: dict[str, float] = {}
    busy_until = kernels[0][1] if kernels else 0.0
    for start, end in kernels[1:]:
        if start > busy_until:
            open_ranges = [r for r in ranges if r[0] <= busy_until < r[1]]
            name = min(open_ranges, key=lambda r: r[1] - r[0])[2] if open_ranges else "outside"
            idle[name] = idle.get(name, 0.0) + (start - busy_until) / 1e3 / steps
        busy_until = max(busy_until, end)
    return dict(sorted(idle.items(), key=lambda kv: -kv[1]))


def device_kernels_by_phase(events: Any, steps: int) -> dict[str, float]:
    """Kernel time per step by the engine phase that launched it: the innermost phase range
    on the device's timeline (the profiler's mirror of each ``record_function``) around the
    kernel's start; ``outside`` when none is."""
    ranges = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type.name == "CUDA" and _annotation(e)
    ]
    busy: dict[str, float] = {}
    for e in events:
        if e.device_type.name != "CUDA" or _annotation(e):
            continue
        start = e.time_range.start
        around = [r for r in ranges if r[0] <= start < r[1]]
        name = min(around, key=lambda r: r[1] - r[0])[2] if around else "outside"
        busy[name] = busy.get(name, 0.0) + e.time_range.elapsed_us() / 1e3 / steps
    return dict(sorted(busy.items(), key=lambda kv: -kv[1]))


def _annotation(event: Any) -> bool:
    """A ``record_function`` range (the profiler mirrors each one on the device's timeline)."""
    return bool(getattr(event, "is_user_annotation", False))


def _fresh_prompts(eng: Code2WavEngine, streams: list[Any]) -> None:
    for st in streams:  # a prompt starts from empty caches
        enc = eng.runner.streams[st.stream_id].encoder
        enc.length, enc.short_lookahead = 0, False
        eng.runner.encoder.cnn[enc.slot].zero_()
    prompts = [eng.runner._prompt_tokens(st) for st in streams]
    eng.runner._encode(streams, prompts, [False] * len(streams))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
