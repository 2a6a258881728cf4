"""Reference-voice preparation: parity checks and timings on one device.

Checks (recorded, never asserted): CAM++ torch (eager and CUDA graphs) vs CPU ONNX Runtime over
random 2-10 s references with TF32 off and on; host+device split vs the reference's one-shot
``Token2wav._prepare_prompt``; asynchronous vs inline preparation, bit for bit, for shared and
distinct voices. Timings: CAM++ per 6 s reference (ONNX Runtime with one intra-op thread, the
serving default, vs torch on the device), per reference when 32 arrive together, and the total
preparation latency of 32 simultaneous new voices, sequential inline vs asynchronous.

Usage::

    python -m minicpm_speech_runtime.bench.prep_bench --generate real --workdir /tmp/ck \
        --git-rev "$(git rev-parse HEAD)" --json runtime/bench-results/prep-h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..assets import Code2WavModels, load_code2wav
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from ..fixtures.synth import wav_bytes
from ..voice.campplus_graphs import CampPlusGraphs
from ..voice.device import STAGING, DeviceHalf
from ..voice.host import prepare_host
from ..voice.prep import PrepConfig, VoicePrep
from ..voice.speaker import OrtSpeaker, TorchSpeaker


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], Any], device: torch.device, repeat: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    a, b = a.float().cpu(), b.float().cpu()
    cos = torch.nn.functional.cosine_similarity(a, b).min().item()
    return cos, ((a - b).abs().max() / b.abs().max()).item()


def _references(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    rates = [16000, 22050, 24000, 44100, 48000]
    return [
        wav_bytes(float(rng.uniform(2.0, 10.0)), int(rng.choice(rates)), seed=seed + i)
        for i in range(n)
    ]


def campplus_parity(
    models: Code2WavModels, graphs: CampPlusGraphs | None, n: int
) -> dict[str, Any]:
    ort = OrtSpeaker(models.campplus_onnx, threads=1)
    feats = [prepare_host(d).fbank for d in _references(n, 1000)]
    expected = [ort.embed(f) for f in feats]
    out: dict[str, Any] = {"references": n, "seconds": "2-10"}
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        variants: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "eager": lambda f: models.campplus(f.to(models.device)),
        }
        if graphs is not None:
            # Graphs keep the math mode they were captured with: capture a set per setting.
            tf_graphs = graphs
            if tf32:
                tf_graphs = CampPlusGraphs(models.campplus, models.device, (1,), (1000,))
                tf_graphs.capture()
            variants["cuda_graphs"] = cast(
                Callable[[torch.Tensor], torch.Tensor],
                lambda f, g=tf_graphs: g(f.to(models.device)),
            )
        for name, fn in variants.items():
            with torch.inference_mode():
                pairs = [_compare(fn(f), e) for f, e in zip(feats, expected, strict=True)]
            out[f"{name}_tf32_{'on' if tf32 else 'off'}"] = {
                "min_cosine": min(p[0] for p in pairs),
                "max_normalised_abs_diff": max(p[1] for p in pairs),
            }
        with torch.inference_mode():
            speaker = TorchSpeaker(models.campplus, models.device, graphs)
            batch = speaker.embed_batch([f[0] for f in feats])
        pairs = [_compare(batch[i : i + 1], e) for i, e in enumerate(expected)]
        out[f"masked_batch_tf32_{'on' if tf32 else 'off'}"] = {
            "min_cosine": min(p[0] for p in pairs),
            "max_normalised_abs_diff": max(p[1] for p in pairs),
        }
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return out


def reference_parity(models: Code2WavModels, tmp: Path) -> dict[str, Any]:
    """Split vs the reference's one-shot preparation, run unmodified on ``models.device``."""
    import soundfile as sf
    import stepaudio2.token2wav as t2w
    import torchaudio

    def sf_load(path: str, *args: object, **kwargs: object) -> tuple[torch.Tensor, int]:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
        return torch.from_numpy(data.T.copy()), rate

    torchaudio.load = sf_load  # torchcodec is absent; the reference asks for soundfile anyway
    if models.device.type != "cuda":
        return {"skipped": "the reference method needs CUDA"}
    ref = t2w.Token2wav.__new__(t2w.Token2wav)
    ref.audio_tokenizer, ref.flow = models.tokenizer, models.flow
    ref.spk_model = OrtSpeaker(models.campplus_onnx).session
    half = DeviceHalf(models.tokenizer, OrtSpeaker(models.campplus_onnx), models.device)
    results = []
    for i, data in enumerate(_references(6, 2000)):
        path = tmp / f"ref{i}.wav"
        path.write_bytes(data)
        want = ref._prepare_prompt(str(path))
        have = half.run(prepare_host(data, models.up_rate)).as_reference_tuple()
        results.append([bool(torch.equal(a, b)) for a, b in zip(want, have, strict=True)])
    names = ["tokens", "tokens_len", "spk_emb", "prompt_mels", "prompt_mels_len"]
    return {name: all(r[i] for r in results) for i, name in enumerate(names)} | {"voices": 6}


def async_vs_inline(models: Code2WavModels, speaker: TorchSpeaker, tmp: Path) -> dict[str, Any]:
    half = DeviceHalf(models.tokenizer, speaker, models.device)
    distinct = _references(16, 3000)
    shared = _references(4, 4000)
    requests = [(f"d{i}", d) for i, d in enumerate(distinct)]
    requests += [(f"s{i}", shared[i % 4]) for i in range(16)]
    prep = VoicePrep(half, PrepConfig(workers=8, queue_size=64, spool_dir=tmp / "spool"))
    try:
        for rid, data in requests:
            prep.submit(rid, data)
        prep.wait_idle(120)
        voices = {rid: prep.acquire(rid) for rid, _ in requests}
        identical = 0
        for rid, data in requests:
            inline = half.run(prepare_host(data, models.up_rate))
            identical += all(
                torch.equal(a, b)
                for a, b in zip(voices[rid].tensors(), inline.tensors(), strict=True)
            )
        for rid, _ in requests:
            prep.release(rid)
        prep.wait_idle(60)
        return {
            "requests": len(requests),
            "bit_identical": identical,
            "counters": prep.counters.snapshot(),
            "spool_files_left": len(prep.live_spool_files()),
            "pins_left": len(prep.pins()),
            "staging_buffers_live": STAGING.live,
        }
    finally:
        prep.close()


def cancellation(models: Code2WavModels, speaker: TorchSpeaker, tmp: Path) -> dict[str, Any]:
    """Random cancellation in every job state on this device; what is left afterwards."""
    import gc
    import random

    half = DeviceHalf(models.tokenizer, speaker, models.device)
    prep = VoicePrep(half, PrepConfig(workers=8, queue_size=64, spool_dir=tmp / "cancel"))
    rng = random.Random(7)
    voices = _references(48, 5000)
    gone: set[int] = set()
    try:
        for i, data in enumerate(voices):
            prep.submit(f"c{i}", data)
            if rng.random() < 0.3:
                prep.cancel(f"c{i}")  # queued or just started
                gone.add(i)
        time.sleep(0.05)
        for i in range(len(voices)):
            roll = rng.random()
            if i in gone:
                continue
            if roll < 0.3:
                prep.cancel(f"c{i}")  # running or finished
            elif roll < 0.6:
                prep.acquire(f"c{i}")
                prep.release(f"c{i}")
            else:
                prep.release(f"c{i}")
        prep.wait_idle(120)
        _sync(models.device)
        gc.collect()
        return {
            "requests": len(voices),
            "counters": prep.counters.snapshot(),
            "spool_files_left": len(prep.live_spool_files()),
            "pins_left": len(prep.pins()),
            "jobs_left": prep.pending_jobs(),
            "cache_entries": len(prep.cache_keys()),
            "staging_buffers_live": STAGING.live,
            "staging_buffers_total": STAGING.total,
        }
    finally:
        prep.close()


def campplus_timing(
    models: Code2WavModels, graphs: CampPlusGraphs | None, repeat: int
) -> dict[str, Any]:
    ort = OrtSpeaker(models.campplus_onnx, threads=1)
    one = prepare_host(wav_bytes(6.0, 16000, seed=5)).fbank
    many = [prepare_host(wav_bytes(6.0, 16000, seed=50 + i)).fbank for i in range(32)]
    dev = models.device
    one_dev = one.to(dev)
    res: dict[str, Any] = {"reference_seconds": 6.0}
    res["ort_cpu_1thread_ms"] = statistics.median(_time(lambda: ort.embed(one), dev, repeat))
    with torch.inference_mode():
        res["torch_eager_ms"] = statistics.median(
            _time(lambda: models.campplus(one_dev), dev, repeat)
        )
        if graphs is not None:
            res["torch_graph_ms"] = statistics.median(_time(lambda: graphs(one_dev), dev, repeat))
        ort_32 = statistics.median(_time(lambda: [ort.embed(f) for f in many], dev, 3, 1))
        res["ort_cpu_32_sequential_ms_per_ref"] = ort_32 / 32
        speaker = TorchSpeaker(models.campplus, dev, graphs)
        batch_ms = statistics.median(
            _time(lambda: speaker.embed_batch([f[0] for f in many]), dev, repeat)
        )
        res["torch_batch32_ms_per_ref"] = batch_ms / 32
        eager = TorchSpeaker(models.campplus, dev, None)
        res["torch_eager_batch32_ms_per_ref"] = (
            statistics.median(_time(lambda: eager.embed_batch([f[0] for f in many]), dev, 3)) / 32
        )
    best_one = res.get("torch_graph_ms", res["torch_eager_ms"])
    res["speedup_single"] = res["ort_cpu_1thread_ms"] / best_one
    res["speedup_per_ref_32"] = (
        res["ort_cpu_32_sequential_ms_per_ref"] / res["torch_batch32_ms_per_ref"]
    )
    return res


def prep_latency(
    models: Code2WavModels, speaker: TorchSpeaker, tmp: Path, workers: int
) -> dict[str, Any]:
    """Total time to prepare 32 simultaneous new voices."""
    dev = models.device
    res: dict[str, Any] = {"voices": 32, "reference_seconds": 6.0, "workers": workers}

    def fresh(seed: int) -> list[bytes]:
        return [wav_bytes(6.0, 24000, seed=seed + i) for i in range(32)]

    for name, backend in (("onnxruntime", OrtSpeaker(models.campplus_onnx)), ("torch", speaker)):
        half = DeviceHalf(models.tokenizer, backend, dev)
        half.run(prepare_host(wav_bytes(6.0, 24000, seed=1)))  # warm-up
        voices = fresh(10_000 + len(res) * 100)
        _sync(dev)
        t0 = time.perf_counter()
        for data in voices:
            half.run(prepare_host(data))
        _sync(dev)
        res[f"sequential_inline_{name}_ms"] = (time.perf_counter() - t0) * 1e3
    half = DeviceHalf(models.tokenizer, speaker, dev)
    prep = VoicePrep(half, PrepConfig(workers=workers, queue_size=64, spool_dir=tmp / "lat"))
    try:
        voices = fresh(20_000)
        _sync(dev)
        t0 = time.perf_counter()
        for i, data in enumerate(voices):
            prep.submit(f"r{i}", data)
        prep.wait_idle(120)
        t_ready = time.perf_counter()
        acquire_ms = []
        for i in range(len(voices)):
            a0 = time.perf_counter()
            prep.acquire(f"r{i}")
            acquire_ms.append((time.perf_counter() - a0) * 1e3)
        _sync(dev)
        res["async_ms"] = (time.perf_counter() - t0) * 1e3
        res["async_jobs_settled_ms"] = (t_ready - t0) * 1e3
        res["acquire_ahead_median_ms"] = statistics.median(acquire_ms)
        res["counters"] = prep.counters.snapshot()
        for i in range(len(voices)):
            prep.release(f"r{i}")
    finally:
        prep.close()
    res["speedup_vs_inline_onnxruntime"] = res["sequential_inline_onnxruntime_ms"] / res["async_ms"]
    res["speedup_vs_inline_torch"] = res["sequential_inline_torch_ms"] / res["async_ms"]
    return res


def _print(results: dict[str, Any]) -> None:
    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            shown = f"{node:.6g}" if isinstance(node, float) else str(node)
            print(f"{prefix:<60} {shown}")

    walk("", results)


def main() -> None:
    parser = argparse.ArgumentParser(description="reference-voice preparation benchmark")
    parser.add_argument("--checkpoint", type=Path, help="existing Code2Wav folder")
    parser.add_argument("--generate", choices=["tiny", "real"], help="write a random checkpoint")
    parser.add_argument("--campplus-onnx", type=Path, help="reuse this CAM++ export")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--git-rev", default="unknown")
    parser.add_argument("--refs", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_revision": args.git_rev,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
        "python": platform.python_version(),
    }
    folder = args.checkpoint
    if args.generate:
        t0 = time.perf_counter()
        dims = REAL if args.generate == "real" else TINY
        folder = write_random_checkpoint(args.workdir / "ckpt", dims, 0, args.campplus_onnx)
        results["checkpoint_generate_s"] = time.perf_counter() - t0
    results["checkpoint"] = args.generate or str(folder)
    t0 = time.perf_counter()
    models = load_code2wav(folder, dev)
    results["load_s"] = time.perf_counter() - t0
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    graphs = None
    if dev.type == "cuda":
        t0 = time.perf_counter()
        graphs = CampPlusGraphs(models.campplus, dev)
        graphs.capture()
        results["campplus_graph_capture_s"] = time.perf_counter() - t0
        results["campplus_graphs"] = len(graphs._graphs)
    speaker = TorchSpeaker(models.campplus, dev, graphs)
    stages: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("campplus_parity", lambda: campplus_parity(models, graphs, args.refs)),
        ("reference_parity", lambda: reference_parity(models, args.workdir)),
        ("async_vs_inline", lambda: async_vs_inline(models, speaker, args.workdir)),
        ("cancellation", lambda: cancellation(models, speaker, args.workdir)),
        ("campplus_timing", lambda: campplus_timing(models, graphs, args.repeat)),
        ("prep_latency_32", lambda: prep_latency(models, speaker, args.workdir, args.workers)),
    ]
    for name, stage in stages:
        t0 = time.perf_counter()
        try:
            results[name] = stage()
        except Exception as exc:  # record and go on: one broken stage must not hide the rest
            results[name] = {"error": repr(exc)}
        results[name]["stage_s"] = time.perf_counter() - t0
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if dev.type == "cuda":
        results["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    args.json.write_text(json.dumps(results, indent=2))
    _print(results)


if __name__ == "__main__":
    main()
