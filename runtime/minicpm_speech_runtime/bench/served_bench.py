"""The served path on one device: vLLM-Omni 0.30.0's own stage-2 model, ``MiniCPMO45Code2Wav``
(the class from its wheel, built by its own ``load_weights``), driven the way its generation
runner drives it, with this project's plugin on; vLLM-Omni's own backend (plugin off); and this
project's engine driven directly (``engine_bench.run_engine``). All three in one run.

For each concurrency C: C streams, each a distinct cold voice (its own reference waveform of
3-10 s) and 250 tokens, handed over by vLLM-Omni's stage-1 hook (``tts2code2wav_async_chunk``)
25 tokens per step, so every window is 3 + 25 tokens; every live request's window goes into
one ``forward`` per step, and a finished stream is replaced at once (closed loop). A request
arrives ``--lead-steps`` stage-2 steps before its first window (standing for the Thinker's
prefill and the Talker's first 25 codes, which run in other processes when served; 3 steps is
0.1-0.4 s here, less than those take) and its voice is spooled as vLLM-Omni's orchestrator
hands it over, so the plugin prepares it from arrival; with ``--lead-steps 0`` it arrives with
its first window. Streams ramp up at most C/10 per step
until C are live, then run one more utterance; then the measured window. Figures: audio-s/s,
first audio (first hand-over to first non-empty output) p50/p95, engine steps per forward (plugin
on, from the engine's own counter), peak memory, the device memory the built model holds before
any stream (``model_gib``: its weights and what its build allocated), and what the plugin's
``plugin.json`` says of the weights it let go and holds.

Where ``vllm`` cannot be installed (the GPU machine), :mod:`.vllm_stand_ins` stands in for the
names stage-2 code imports; the JSON lists every one that was used.

Usage (one GPU; wheels of vllm-omni, s3tokenizer, HyperPyYAML, ruamel.yaml, soundfile and
stepaudio2-minicpmo carried, and of msgspec, prettytable, wcwidth and omegaconf, which
vLLM-Omni's stage-2 modules import, where the machine lacks them)::

    python -m minicpm_speech_runtime.bench.served_bench --generate real \
        --campplus-onnx .bench-assets/campplus.onnx --conc 1,8,32,64 --own-conc 1,8,32 \
        --git-rev "$(git rev-parse --short HEAD)" --json runtime/bench-results/served-h200.json \
        --png runtime/bench-results/served-h200.png

``--served-extra KEY=VALUE`` (repeatable) sets a connector extra of the plugin-on rows over the
high-concurrency profile's, checked as the pod checks a profile: ``token2wav_precision=bf16
--served-extra token2wav_cache_mib=16960`` measures a precision and a per-voice pool where users
get them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import yaml
from minicpm_speech_contract.bounded import BoundedInputError, load_yaml
from minicpm_speech_contract.extras import first_problem

from ..engine.workspace import use_serving_allocator
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from ..fixtures.synth import voice_like, wav_bytes
from . import vllm_stand_ins
from .engine_bench import (
    PIECE,
    SR,
    UTT_TOKENS,
    _pct,
    _peak_gib,
    _reset_peak,
    _save,
    _stage,
    _sync,
    bench_voices,
    finish_plot,
    matmul_peak,
    run_engine,
)
from .parity import utterance

# The Code2Wav connector extras of profiles/high-concurrency.yaml; stage 2's max_num_seqs is
# set to each C so that no stream waits for a slot.
SERVED_EXTRAS: dict[str, Any] = {
    "batched_code2wav": True,
    "micro_batch_size": 8,
    "cfm_graph_precapture": True,
    "cfm_max_graphs": 72,
    "token2wav_allow_tf32": True,
    "token2wav_float16": False,
    "campplus_backend": "cuda",
    "reference_prep_workers": 4,
    "reference_cache_size": 32,
}
# vLLM-Omni's own Code2Wav with its CFM and HiFT graphs on, as its shipped config runs it.
OWN_EXTRAS: dict[str, Any] = {
    "enable_cfm_graph": True,
    "enable_hift_graph": True,
    "token2wav_allow_tf32": True,
}
CONNECTOR = {"codec_chunk_frames": 25, "codec_left_context_frames": 3}
MAX_EXTRA_CHARS = 200


@dataclasses.dataclass
class _Stream:
    tokens: list[int]
    ref: np.ndarray
    sent: int = 0
    started: float = 0.0
    heard: bool = False


class ServedLoop:
    """The closed-loop client of one stage-2 model: C live requests, 25 tokens each per step,
    every request with a new window in one ``forward``."""

    def __init__(
        self, model: Any, extras: dict[str, Any], seconds: list[float], lead_steps: int = 0
    ) -> None:
        from .stage2 import Request, Stage2

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.stage = Stage2(model, {**CONNECTOR, **extras}, device)
        self.request = Request
        self.seconds = seconds
        self.live: dict[str, _Stream] = {}
        self.successors: deque[tuple[str, _Stream]] = deque()  # arrived, no window yet
        self.lead_steps = lead_steps
        self.next = 0
        self.reset_stats()

    def reset_stats(self) -> None:
        self.first: list[float] = []
        self.samples = 0
        self.forwards: list[int | None] = []
        self.forward_s = 0.0  # inside stage 2's forward; the rest is the hook and transport

    def _arrive(self) -> tuple[str, _Stream]:
        """A request arrives: stage 2's records, and its voice spooled at arrival."""
        i = self.next
        self.next += 1
        rid = f"req-{i}"
        ref = voice_like(self.seconds[i % len(self.seconds)], SR, seed=10_000 + i)  # cold
        stream = _Stream(utterance(UTT_TOKENS, i), ref)
        self.stage.add(self.request(rid, stream.tokens, ref, SR))
        return rid, stream

    def _start(self) -> None:
        rid, stream = self.successors.popleft() if self.successors else self._arrive()
        self.live[rid] = stream

    def step(self, conc: int, ramp: int | None = None) -> None:
        room = conc - len(self.live)
        for _ in range(room if ramp is None else min(room, ramp)):
            self._start()
        # Requests arrive ahead of their first window, as the Thinker and the Talker's first
        # 25 codes take that long: a stream within ``lead_steps`` windows of its end has its
        # successor's request arrive now, to take its place when it ends.
        ending = sum(1 for s in self.live.values()
                     if len(s.tokens) - s.sent <= self.lead_steps * PIECE)
        while len(self.successors) < min(ending, conc):
            self.successors.append(self._arrive())
        ready, finished = [], []
        now = time.perf_counter()
        for rid, s in self.live.items():
            piece = s.tokens[s.sent : s.sent + PIECE]
            s.sent += len(piece)
            last = s.sent >= len(s.tokens)
            if not s.started:
                s.started = now
            if self.stage.emit(rid, piece, last):
                ready.append(rid)
            if last:
                finished.append(rid)
        if ready:
            _sync()
            begin = time.perf_counter()
            self.stage.step(ready)
            _sync()
            self.forward_s += time.perf_counter() - begin
            self.forwards.append(self.stage.forwards[-1][1])
        now = time.perf_counter()
        for rid in ready:
            audio = self.stage.pcm[rid][-1]
            n = int(audio.numel())
            self.samples += n
            s = self.live[rid]
            if n and not s.heard:
                s.heard = True
                self.first.append(now - s.started)
        for rid in finished:
            self.live.pop(rid)
            self.stage.pcm.pop(rid, None)

    def run(self, conc: int, seconds: float, min_steps: int = 0, ramp: int | None = None) -> None:
        end, steps = time.perf_counter() + seconds, 0
        while time.perf_counter() < end or steps < min_steps:
            steps += 1
            if len(self.live) == conc:
                ramp = None
            self.step(conc, ramp)

    def drain(self) -> None:
        """Let every live request go, as an aborting client does."""
        self.stage.model.on_requests_finished(set(self.live) | {r for r, _ in self.successors})
        self.live.clear()
        self.successors.clear()


def build_model(folder: Path, extras: dict[str, Any], max_num_seqs: int) -> tuple[Any, float]:
    """vLLM-Omni's model on ``folder`` and the device memory it holds once built (GiB)."""
    from .stage2 import build_code2wav

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    model = build_code2wav(folder, {**CONNECTOR, **extras}, max_num_seqs=max_num_seqs)
    _sync()
    held = (torch.cuda.memory_allocated() - base) if torch.cuda.is_available() else 0
    return model, held / 2**30


def run_served(
    folder: Path, extras: dict[str, Any], conc: int, window: float, seconds: list[float],
    control: Path, profile: bool = False, lead_steps: int = 0,
) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if extras.get("batched_code2wav"):
        # vLLM-Omni's runtime-prompt cache keeps voices from arrival to their first window
        extras = {**extras, "token2wav_runtime_prompt_cache_size": 2 * conc + 8}
    model, model_gib = build_model(folder, extras, max_num_seqs=conc)
    plugin = _read_json(control / "plugin.json") if extras.get("batched_code2wav") else None
    precapture = _read_json(control / "precapture.json") if plugin else None
    loop = ServedLoop(model, extras, seconds, lead_steps)
    loop.run(conc, seconds=2.0, min_steps=22, ramp=-(-conc // 10))
    _reset_peak()
    loop.reset_stats()
    leads = _arrival_leads()
    prep = getattr(model.backend, "prep", None)
    outcomes = prep.counters.snapshot() if prep is not None else {}
    waits = _Waits(model) if extras.get("batched_code2wav") else None
    t0 = time.perf_counter()
    loop.run(conc, seconds=window)
    wall = time.perf_counter() - t0
    if waits is not None:
        waits.close()
    steps = [n for n in loop.forwards if n is not None]
    res: dict[str, Any] = {
        # audio over the time stage 2 spent in its forwards: stage 1's hook and the transport,
        # which the loop runs in this process, run in other processes when served
        "audio_s_per_s": loop.samples / SR / max(loop.forward_s, 1e-9),
        "wall_audio_s_per_s": loop.samples / SR / wall,
        "forward_share_of_wall": loop.forward_s / wall,
        "first_audio_p50_ms": _ms(_pct(loop.first, 50)),
        "first_audio_p95_ms": _ms(_pct(loop.first, 95)),
        "first_audio_samples": len(loop.first),
        "forwards": len(loop.forwards),
        "engine_steps_per_forward": float(np.mean(steps)) if steps else None,
        "engine_steps_per_forward_max": max(steps) if steps else None,
        "peak_mem_gib": _peak_gib(),
        "model_gib": model_gib,
        "window_s": wall,
        "backend": type(model.backend).__name__,
        "lead_steps": lead_steps,
        **_arrival_leads(leads),
    }
    if waits is not None:
        res["waits_ms_per_forward"] = waits.per_forward(len(loop.forwards))
    if prep is not None:
        after = prep.counters.snapshot()
        res["prep_outcomes"] = {k: after[k] - outcomes.get(k, 0) for k in after}
    if profile:
        res["phases"] = _profiled(loop, conc)
    if plugin is not None:
        res["plugin_weight_bytes"] = plugin.get("weight_bytes")
        res["max_streams"] = plugin.get("max_streams")
        res["precapture_state"] = (precapture or {}).get("state")
        res["graphs"] = model.backend.engine.graph_stats()
        cfg = model.backend.engine.config  # what the plugin built from the extras
        res["engine_config"] = {"precision": cfg.precision, "n_timesteps": cfg.n_timesteps,
                                "cache_mib": cfg.cache_mib, "max_streams": cfg.max_streams}
    loop.drain()
    close = getattr(model.backend, "close", None)
    if callable(close):
        close()
    del loop, model
    return res


class _Waits:
    """Where a forward's host thread waits, without syncing anything itself: on the backend's
    model lock (held by the arrival watcher while it normalises a voice) and in the engine's
    device-to-host copy of a step's audio (the host is ahead of the device there)."""

    def __init__(self, model: Any) -> None:
        import threading

        from ..engine import engine as engine_module

        self.spent = {"model_lock": 0.0, "device": 0.0}
        self.backend, self.module = model.backend, engine_module
        # the engine module's name for its device-to-host copy, replaced while timing
        self.lock, self.to_host = model.backend.model_lock, vars(engine_module)["to_host"]
        main, spent, lock, to_host = threading.main_thread(), self.spent, self.lock, self.to_host

        class TimedLock:
            def __enter__(self) -> None:
                begin = time.perf_counter()
                lock.acquire()
                if threading.current_thread() is main:
                    spent["model_lock"] += time.perf_counter() - begin

            def __exit__(self, *_: Any) -> None:
                lock.release()

        def timed_to_host(tensors: Any) -> Any:
            begin = time.perf_counter()
            try:
                return to_host(tensors)
            finally:
                spent["device"] += time.perf_counter() - begin

        self.backend.model_lock = TimedLock()
        vars(engine_module)["to_host"] = timed_to_host

    def close(self) -> None:
        self.backend.model_lock, vars(self.module)["to_host"] = self.lock, self.to_host

    def per_forward(self, forwards: int) -> dict[str, float]:
        return {k: v / max(1, forwards) * 1e3 for k, v in self.spent.items()}


def _profiled(loop: ServedLoop, conc: int, seconds: float = 3.0) -> dict[str, Any]:
    """Where a forward's time goes, over a few seconds of steps: the device is synchronised at
    the edges of vLLM-Omni's ``forward``, the backend's ``plan_forward`` (preparation lookups,
    stream setup and token pushes, then the engine step) and the engine's ``step``, so each
    phase holds its own device work. Mean milliseconds per forward."""
    backend = loop.stage.model.backend
    spent: dict[str, float] = {"forward": 0.0, "plan_forward": 0.0, "engine_step": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            _sync()
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                spent[name] += time.perf_counter() - begin
        return run

    model = loop.stage.model
    model.forward = timed("forward", model.forward)
    backend.plan_forward = timed("plan_forward", backend.plan_forward)
    backend.engine.step = timed("engine_step", backend.engine.step)
    before = len(loop.forwards)
    runner = backend.engine.runner
    phases0 = dict(runner.phase_s)
    runner.profile = True
    try:
        loop.run(conc, seconds=seconds)
    finally:
        runner.profile = False
        for obj, name in ((model, "forward"), (backend, "plan_forward"),
                          (backend.engine, "step")):
            del obj.__dict__[name]
    n = max(1, len(loop.forwards) - before)
    syncs = _host_syncs(loop, conc) if torch.cuda.is_available() else {}
    return {
        "host_syncs_per_forward": syncs,
        "forwards": n,
        "forward_ms": spent["forward"] / n * 1e3,
        "vllm_omni_outside_plan_ms": (spent["forward"] - spent["plan_forward"]) / n * 1e3,
        "plan_outside_engine_step_ms": (spent["plan_forward"] - spent["engine_step"]) / n * 1e3,
        "engine_step_ms": spent["engine_step"] / n * 1e3,
        "engine_phase_ms": {k: (v - phases0.get(k, 0.0)) / n * 1e3
                            for k, v in runner.phase_s.items()},
    }


def _host_syncs(loop: ServedLoop, conc: int, seconds: float = 1.5) -> dict[str, float]:
    """Where the host waits for the device inside a forward: torch's sync debug mode warns at
    every synchronising call; counted by the line of this project's or vLLM-Omni's code that
    made it, per forward."""
    import traceback
    import warnings

    counts: dict[str, int] = {}

    def record(message: Any, *_: Any, **__: Any) -> None:
        for frame in reversed(traceback.extract_stack()[:-1]):
            if ("minicpm_speech_runtime" in frame.filename and "bench" not in frame.filename) \
                    or "vllm_omni" in frame.filename:
                where = f"{Path(frame.filename).name}:{frame.lineno}"
                counts[where] = counts.get(where, 0) + 1
                return

    before = len(loop.forwards)
    saved = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loop.run(conc, seconds=seconds)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = saved
    n = max(1, len(loop.forwards) - before)
    return {k: v / n for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:25]}


_LEADS = {
    "arrival_to_prepared": "minicpm_speech_reference_arrival_to_prepared_seconds",
    "arrival_to_first_window": "minicpm_speech_reference_arrival_to_first_window_seconds",
}


def _arrival_leads(since: dict[str, float] | None = None) -> dict[str, Any]:
    """The runtime's arrival histograms: their sums and counts now, or, given earlier ones,
    the mean of what was observed since (ms) and how many."""
    from prometheus_client import REGISTRY

    now = {f"{k}_{part}": REGISTRY.get_sample_value(f"{name}_{part}") or 0.0
           for k, name in _LEADS.items() for part in ("sum", "count")}
    if since is None:
        return now
    out: dict[str, Any] = {}
    for k in _LEADS:
        n = now[f"{k}_count"] - since.get(f"{k}_count", 0.0)
        total = now[f"{k}_sum"] - since.get(f"{k}_sum", 0.0)
        out[f"{k}_mean_ms"] = total / n * 1e3 if n else None
        out[f"{k}_samples"] = int(n)
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def model_folder(workdir: Path, generate: str, campplus_onnx: Path | None) -> Path:
    """A MiniCPM-o 4.5 model folder as stage 2 reads it: random Code2Wav weights under
    ``assets/token2wav`` and a default prompt."""
    root = workdir / "model"
    # vLLM-Omni builds the speech tokenizer itself, at the released size, whatever the flow's
    dims = REAL if generate == "real" else dataclasses.replace(
        TINY, tokenizer_width=REAL.tokenizer_width, tokenizer_layers=REAL.tokenizer_layers)
    write_random_checkpoint(root / "assets" / "token2wav", dims, 0, campplus_onnx)
    (root / "assets" / "HT_ref_audio.wav").write_bytes(wav_bytes(3.0, SR, seed=7))
    # flow.yaml names its classes ``cosyvoice2.*``; vLLM-Omni 0.30.0 neither ships nor
    # registers that module (the plugin-off rows load it too)
    from ..assets import ensure_cosyvoice2_alias

    ensure_cosyvoice2_alias()
    return root


def served_extras(pairs: list[str]) -> dict[str, Any]:
    """:data:`SERVED_EXTRAS` with ``--served-extra KEY=VALUE`` overrides (each value read as
    YAML by the contract's bounded reader: ``bf16``, ``16960``, ``true``), refused where the
    pod would refuse the profile."""
    extras = dict(SERVED_EXTRAS)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or len(pair) > MAX_EXTRA_CHARS:
            raise SystemExit(f"--served-extra {pair[:80]!r}: write KEY=VALUE (at most "
                             f"{MAX_EXTRA_CHARS} characters), e.g. token2wav_precision=bf16")
        try:
            extras[key] = load_yaml(value, field=f"--served-extra {key[:80]}")
        except BoundedInputError as e:
            raise SystemExit(str(e)) from None
        except yaml.YAMLError:
            raise SystemExit(f"--served-extra {pair[:80]!r}: the value is not YAML") from None
    problem = first_problem(extras)
    if problem is not None:
        raise SystemExit(f"--served-extra: {problem.line()}")
    return extras


def register_plugin(workdir: Path, extras: dict[str, Any]) -> Path:
    """The plugin registered in this process, as the supervisor's environment makes it; returns
    the control directory it writes."""
    from ..serving import plugin
    from ..serving.control import CONTROL_DIR_ENV, DEPLOY_CONFIG_ENV

    deploy = workdir / "deploy.yaml"
    deploy.write_text(yaml.safe_dump(
        {"connectors": {"connector_of_shared_memory": {"extra": extras}}}))
    control = workdir / "control"
    os.environ[DEPLOY_CONFIG_ENV] = str(deploy)
    os.environ[CONTROL_DIR_ENV] = str(control)
    plugin.register()
    return control


def engine_direct(
    res: dict[str, Any], folder: Path, concs: list[int], window: float, peak: float,
    voices: int, out: Path,
) -> None:
    """This project's engine on the same weights, driven directly (prepared voices), on the
    token streams the served rows decode: vLLM-Omni's 3 silence codes, then the utterance."""
    from ..assets import load_code2wav
    from .stage2 import SILENCE

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = load_code2wav(folder / "assets" / "token2wav", dev)
    prepared = bench_voices(models, voices)
    prefix = (SILENCE,) * CONNECTOR["codec_left_context_frames"]
    for c in concs:
        _stage(res["engine"], str(c), cast(Callable[[], Any], lambda c=c: run_engine(
            models, prepared, c, window, peak, True, True, prefix=prefix)))
        _save(res, out)


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per C: the three paths side by side."""
    out = []
    cs = sorted({int(c) for who in ("served", "engine", "vllm_omni") for c in res.get(who, {})})
    for c in cs:
        served, engine, own = (res.get(w, {}).get(str(c), {}) for w in
                               ("served", "engine", "vllm_omni"))
        weights = served.get("plugin_weight_bytes") or {}
        out.append({
            "concurrency": c,
            "served_audio_s_per_s": served.get("audio_s_per_s"),
            "served_wall_audio_s_per_s": served.get("wall_audio_s_per_s"),
            "engine_audio_s_per_s": engine.get("audio_s_per_s"),
            "vllm_omni_audio_s_per_s": own.get("audio_s_per_s"),
            "vllm_omni_wall_audio_s_per_s": own.get("wall_audio_s_per_s"),
            "engine_steps_per_forward": served.get("engine_steps_per_forward"),
            "first_audio_p95_ms": served.get("first_audio_p95_ms"),
            "arrival_to_prepared_mean_ms": served.get("arrival_to_prepared_mean_ms"),
            "arrival_to_first_window_mean_ms": served.get("arrival_to_first_window_mean_ms"),
            "voices_prepared_ahead": (served.get("prep_outcomes") or {}).get("ahead"),
            "voices_prepared_late": (served.get("prep_outcomes") or {}).get("late"),
            "peak_mem_gib": served.get("peak_mem_gib"),
            "code2wav_weight_gib": (weights["engine"] / 2**30) if "engine" in weights else None,
            "vllm_omni_weights_freed_gib": (weights["vllm_omni_freed"] / 2**30)
            if "vllm_omni_freed" in weights else None,
            "served_model_gib": served.get("model_gib"),
            "vllm_omni_model_gib": own.get("model_gib"),
        })
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    table = res["rows"]
    for key, label in (("served_audio_s_per_s", "served (plugin on)"),
                       ("engine_audio_s_per_s", "engine driven directly"),
                       ("vllm_omni_audio_s_per_s", "vLLM-Omni's own backend")):
        pts = [(r["concurrency"], r[key]) for r in table if r.get(key)]
        if pts:
            ax[0].plot(*zip(*pts, strict=True), "o-", label=label)
    for who, label in (("served", "served (plugin on)"), ("vllm_omni", "vLLM-Omni's own")):
        pts = [(int(c), r["first_audio_p95_ms"]) for c, r in res.get(who, {}).items()
               if isinstance(r, dict) and r.get("first_audio_p95_ms")]
        if pts:
            ax[1].plot(*zip(*sorted(pts), strict=True), "o-", label=label)
    finish_plot(fig, ax, f"Code2Wav through vLLM-Omni's stage 2, {res.get('device')}, "
                f"{res.get('date')}", path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generate", choices=["tiny", "real"], default="real")
    p.add_argument("--campplus-onnx", type=Path)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/served-bench"))
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--png", type=Path)
    p.add_argument("--git-rev", default="unknown")
    p.add_argument("--conc", default="1,8,32,64", help="plugin on and engine direct")
    p.add_argument("--own-conc", default="1,8,32", help="vLLM-Omni's own backend")
    p.add_argument("--window", type=float, default=8.0)
    p.add_argument("--voices", type=int, default=16, help="engine direct's prepared voices")
    p.add_argument("--profile-conc", default="", help="served C to time by phase")
    p.add_argument("--lead-steps", type=int, default=3,
                   help="stage-2 steps from a request's arrival to its first window")
    p.add_argument("--served-extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a connector extra for the plugin-on rows (repeatable), over the "
                   "high-concurrency profile's, e.g. token2wav_precision=bf16")
    p.add_argument("--skip-engine", action="store_true")
    a = p.parse_args()
    served = served_extras(a.served_extra)
    use_serving_allocator()
    # before anything imports vLLM-Omni's stage-2 code (all of it is imported lazily below)
    stand_ins = vllm_stand_ins.install()
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_revision": a.git_rev,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available()
        else platform.processor(),
        "command": "python -m minicpm_speech_runtime.bench.served_bench "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
        "served_extras": served,
        "vllm_omni_extras": OWN_EXTRAS,
    }
    a.workdir.mkdir(parents=True, exist_ok=True)
    folder = model_folder(a.workdir, a.generate, a.campplus_onnx)
    control = register_plugin(a.workdir, served)
    seconds = [float(s) for s in np.random.default_rng(0).uniform(3.0, 10.0, 64)]
    if torch.cuda.is_available():  # the engine's roofline figures divide by it
        _stage(res, "matmul_peak", matmul_peak)
    peak = res.get("matmul_peak", {}).get("tf32_tflops", 1.0)
    res["served"], res["engine"], res["vllm_omni"] = {}, {}, {}
    concs = [int(x) for x in a.conc.split(",") if x]
    profiled = {int(x) for x in a.profile_conc.split(",") if x}
    for c in concs:
        _stage(res["served"], str(c),
               cast(Callable[[], Any],
                    lambda c=c: run_served(folder, served, c, a.window, seconds, control,
                                           c in profiled, a.lead_steps)))
        _save(res, a.json)
    if not a.skip_engine:
        engine_direct(res, folder, concs, a.window, peak, a.voices, a.json)
    for c in [int(x) for x in a.own_conc.split(",") if x]:
        _stage(res["vllm_omni"], str(c),
               cast(Callable[[], Any],
                    lambda c=c: run_served(folder, OWN_EXTRAS, c, a.window, seconds, control,
                                           lead_steps=a.lead_steps)))
        _save(res, a.json)
    res["rows"] = rows(res)
    res["vllm_stand_ins"] = vllm_stand_ins.used() if stand_ins else []
    _save(res, a.json)
    if a.png:

        def plot_stage() -> dict[str, Any]:
            plot(res, a.png)
            return {}

        _stage(res, "plot", plot_stage)
        _save(res, a.json)
    _table(res)


def _table(res: dict[str, Any]) -> None:
    keys = ("served_audio_s_per_s", "engine_audio_s_per_s", "vllm_omni_audio_s_per_s",
            "engine_steps_per_forward", "first_audio_p95_ms", "peak_mem_gib",
            "code2wav_weight_gib", "vllm_omni_weights_freed_gib")
    print(f"{'C':>4} " + " ".join(f"{k:>28}" for k in keys))
    for r in res["rows"]:
        print(f"{r['concurrency']:>4} " + " ".join(f"{_fmt(r.get(k)):>28}" for k in keys))
    for who in ("served", "engine", "vllm_omni"):
        for c, r in res.get(who, {}).items():
            if isinstance(r, dict) and "error" in r:
                print(f"{who} C{c} ERROR {r['error'][:300]}")
    print("stand-ins:", ", ".join(res.get("vllm_stand_ins", [])) or "none (vllm installed)")


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


if __name__ == "__main__":
    main()
