"""Every convolution the engine runs, at every batch it can run it: the device memory each one
asks for beyond its own input and output, and the caching allocator's OOMs and retries.

cuDNN chooses a convolution's plan on the first call of each shape and asks the allocator for
that plan's workspace then. With TF32 off, its first choice for some fp32 shapes wanted a
133 GiB workspace on an H200; where that did not fit, PyTorch caught the OOM, emptied the
allocator's cache and tried the next plan. This bench finds every such call. Stages, run with
TF32 off and then on, each in the JSON:

* ``shapes``: the conv calls the engine makes, read by hooks on the encoder's and HiFT's conv
  modules while a one-stream engine (eager, so every call is seen) sets up a voice of every
  prompt length it allows and decodes a last chunk of every length.
* ``sweep``: each such call (module and input length) at every batch from 1 to
  ``--max-streams``, once each, as the first call of that shape. Per call: bytes asked beyond
  the input and output (``extra``), the allocator's ``num_ooms`` and ``num_alloc_retries``.
* ``burst``: the serving engine (``--max-streams`` slots, graphs precaptured) warmed up, then
  that many distinct cold voices at once, decoded to the end. Per phase: allocator events, and
  the most any step or the warm-up held beyond what was held before and after it.

Usage::

    python -m minicpm_speech_runtime.bench.conv_memory --generate real --max-streams 64 \\
        --git-rev "$(git rev-parse --short HEAD)" --json runtime/bench-results/conv-memory.json

The JSON is rewritten after each stage. ``--tf32 off|on`` and ``--skip-sweep``/``--skip-burst``
run a part of it: the whole check takes the better part of half an hour.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from minicpm_speech_contract.allocator import ALLOC_CONF_ENV, ALLOC_CONF_ENV_NEW
from minicpm_speech_contract.extras import cache_mib_for_frames
from torch import nn

from ..assets import Code2WavModels, load_code2wav
from ..engine import EngineConfig
from ..engine.config import CHUNK_TOKENS, LOOKAHEAD_TOKENS, MIN_PROMPT_TOKENS
from ..engine.runner import dit_dims
from ..engine.workspace import (
    OP_MEMORY_BOUND_BYTES,
    bounded_convs,
    expandable_segments_in_use,
    use_serving_allocator,
)
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from ..voice.device import PreparedVoice
from .engine_bench import new_engine
from .parity import drain

ALLOCATOR_EVENTS = ("num_ooms", "num_alloc_retries")
_CONV_TYPES = (nn.Conv1d, nn.ConvTranspose1d)


@dataclass(frozen=True, slots=True)
class ConvCall:
    """One conv module's call on one input length, the batch left out."""

    module: str  # qualified name under the flow or HiFT
    kind: str  # Conv1d or ConvTranspose1d
    channels: int
    length: int


@dataclass(slots=True)
class SweepRow:
    module: str
    kind: str
    channels: int
    length: int
    batch: int
    extra_bytes: int  # peak allocated during the call beyond its input and output
    num_ooms: int
    num_alloc_retries: int
    first_call_ms: float


def random_voice(
    key: str, tokens: int, up_rate: int, seed: int, device: torch.device | str = "cpu"
) -> PreparedVoice:
    """A prepared voice of exactly ``tokens`` prompt tokens on ``device`` (where voice
    preparation leaves one); its values do not matter here."""
    g = torch.Generator().manual_seed(seed)
    frames = up_rate * tokens
    parts = (
        torch.randint(0, 6561, (1, tokens), generator=g, dtype=torch.int32),
        torch.tensor([tokens], dtype=torch.int32),
        torch.randn(1, 192, generator=g),
        torch.randn(1, frames, 80, generator=g) - 5.0,  # about a log-mel's level
        torch.tensor([frames], dtype=torch.int32),
    )
    return PreparedVoice(key, *(t.to(device) for t in parts))


Conv = nn.Conv1d | nn.ConvTranspose1d


def _conv_modules(models: Code2WavModels) -> dict[str, Conv]:
    out: dict[str, Conv] = {}
    for prefix, root in (("flow", models.flow), ("hift", models.hift)):
        for name, mod in root.named_modules():
            if isinstance(mod, _CONV_TYPES):
                out[f"{prefix}.{name}"] = mod
    return out


@contextlib.contextmanager
def recording(modules: dict[str, Conv]) -> Iterator[set[ConvCall]]:
    """Collect the :class:`ConvCall` of every call of these modules while inside."""
    seen: set[ConvCall] = set()
    handles = []
    for name, mod in modules.items():
        def hook(m: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            x = args[0]
            seen.add(ConvCall(name, type(m).__name__, int(x.shape[-2]), int(x.shape[-1])))

        handles.append(mod.register_forward_pre_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def conv_calls(models: Code2WavModels, max_prompt_frames: int, tf32: bool) -> list[ConvCall]:
    """Every conv call a stream of any allowed prompt length and any utterance length makes.

    One stream at a time, eager: a voice of each prompt length, and utterances of every length
    up to three chunks, so every first, continuing and last chunk (alone or after others) runs.
    """
    cfg = EngineConfig(
        max_streams=1, micro_batch=1, max_prompt_frames=max_prompt_frames, tf32=tf32,
        cuda_graphs=False, setup_cache_mib=0,
    )
    eng = new_engine(models, cfg)
    # The DiT has no convolution and a conv's shape never depends on values: its solves return
    # their starting noise here, which leaves the encoder's and HiFT's calls as they are and
    # takes the ten-step solve out of ~250 eager streams (on an H100 the full solves had not
    # finished enumerating after 320 s).
    for est in (eng.runner.estimator, eng.runner.setup_estimator):
        est.solve = lambda s: s.x.clone()  # type: ignore[method-assign]
    prompts = list(range(MIN_PROMPT_TOKENS, max_prompt_frames // models.up_rate + 1))
    utterances = list(range(1, 3 * CHUNK_TOKENS + LOOKAHEAD_TOKENS + 1))
    with recording(_conv_modules(models)) as seen, torch.no_grad():
        for i in range(max(len(prompts), len(utterances))):
            tokens, n = prompts[i % len(prompts)], utterances[i % len(utterances)]
            eng.add_stream(i, random_voice(f"v{tokens}", tokens, models.up_rate, tokens,
                                              models.device))
            eng.push_tokens(i, torch.randint(0, 6561, (n,)).tolist(), last=True)
            for _ in drain(eng, {}, {}):
                pass
    return sorted(seen, key=lambda c: (c.module, c.length))


def _events() -> dict[str, int]:
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_EVENTS}


def _delta(before: dict[str, int]) -> dict[str, int]:
    now = _events()
    return {k: now[k] - before[k] for k in ALLOCATOR_EVENTS}


def plan_key(c: Conv, length: int) -> tuple[Any, ...]:
    """What cuDNN chooses a plan by (the weights' values aside): convs alike in all of it share
    one plan, so the sweep runs one of them."""
    return (type(c).__name__, c.in_channels, c.out_channels, c.kernel_size, c.stride,
            c.padding, c.dilation, c.groups, c.output_padding, length)


def distinct_plans(models: Code2WavModels, calls: list[ConvCall]) -> list[ConvCall]:
    """One call per :func:`plan_key`, the first in ``calls``' order."""
    modules = _conv_modules(models)
    seen: dict[tuple[Any, ...], ConvCall] = {}
    for c in calls:
        seen.setdefault(plan_key(modules[c.module], c.length), c)
    return list(seen.values())


def sweep(
    models: Code2WavModels, calls: list[ConvCall], batches: list[int], tf32: bool,
    bounded: bool = True,
) -> list[SweepRow]:
    """Each call at each batch, once: the first call of a shape, where cuDNN picks its plan;
    run as the engine runs it (:func:`~..engine.workspace.bounded_convs`)."""
    modules = _conv_modules(models)
    dev = models.device
    rows = []
    plans, t_start = distinct_plans(models, calls), time.perf_counter()
    with torch.no_grad(), bounded_convs(bounded and not tf32):
        for n, c in enumerate(plans):
            if n % 250 == 0:  # a long sweep says how far it is, and where its time goes
                print(f"sweep tf32={'on' if tf32 else 'off'}: plan {n}/{len(plans)} "
                      f"({c.module}, {c.length} frames), {time.perf_counter() - t_start:.0f} s",
                      flush=True)
            mod = modules[c.module]
            for b in batches:
                x = torch.randn(b, c.channels, c.length, device=dev)
                torch.cuda.synchronize()
                before, held = _events(), torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                y = mod(x)
                torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                extra = torch.cuda.max_memory_allocated() - held - y.numel() * y.element_size()
                d = _delta(before)
                rows.append(SweepRow(c.module, c.kind, c.channels, c.length, b, max(0, extra),
                                     d["num_ooms"], d["num_alloc_retries"], ms))
                del x, y
    return rows


def sweep_summary(rows: list[SweepRow], bound: int) -> dict[str, Any]:
    """The worst call, the calls over ``bound`` or with allocator events, and totals."""
    if not rows:
        raise ValueError("no conv calls were swept")
    worst = max(rows, key=lambda r: r.extra_bytes)
    offending = [r for r in rows if r.extra_bytes > bound or r.num_ooms or r.num_alloc_retries]
    return {
        "calls": len(rows),
        "worst": asdict(worst),
        "worst_extra_mib": worst.extra_bytes / 2**20,
        "over_bound_or_events": [asdict(r) for r in offending[:50]],
        "over_bound_or_events_count": len(offending),
        "num_ooms": sum(r.num_ooms for r in rows),
        "num_alloc_retries": sum(r.num_alloc_retries for r in rows),
        "slowest_first_call_ms": max(r.first_call_ms for r in rows),
        "ok": not offending,
    }


def burst_prompt_tokens(max_streams: int, top: int) -> list[int]:
    """The burst's prompts: 3 s up to the longest allowed (``top`` tokens), evenly spread."""
    return [75 + (i * (top - 75)) // max(1, max_streams - 1) for i in range(max_streams)]


def pool_mib_for(models: Code2WavModels, cfg: EngineConfig, prompts: list[int]) -> int:
    """The least ``cache_mib`` that holds streams of these prompts (in tokens) all at once."""
    frames = sum(2 * cfg.stream_frames(t * models.up_rate) for t in prompts)
    return cache_mib_for_frames(frames, cfg.n_timesteps, cfg.precision,
                                *dit_dims(cast(Any, models.flow)))


def burst(
    models: Code2WavModels, max_streams: int, tf32: bool, bounded: bool = True,
    utterance_tokens: int = 100, per_voice_pool: bool = False,
) -> dict[str, Any]:
    """Warm-up, then ``max_streams`` distinct cold voices (3-10 s) at once, to the end.

    ``per_voice_pool`` sizes the key/value pool for exactly these voices (``cache_mib``), as a
    pod sharing its GPU would, instead of every slot at the longest prompt."""
    cfg = EngineConfig(max_streams=max_streams, micro_batch=min(8, max_streams), tf32=tf32,
                       graph_budget=72, bounded_convs=bounded)
    top = cfg.max_prompt_frames // models.up_rate
    prompts = burst_prompt_tokens(max_streams, top)
    if per_voice_pool:
        cfg = replace(cfg, cache_mib=pool_mib_for(models, cfg, prompts))
    torch.cuda.synchronize()
    events = _events()
    eng = new_engine(models, cfg)
    before_warmup = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    graphs = eng.warmup()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    held = torch.cuda.memory_allocated()
    warm_transient = torch.cuda.max_memory_allocated() - max(before_warmup, held)
    warm_events = _delta(events)
    reserved_after_warmup = torch.cuda.memory_reserved()
    events = _events()
    for i, tokens in enumerate(prompts):
        eng.add_stream(i, random_voice(f"burst{i}", tokens, models.up_rate, 1000 + i,
                                              models.device))
        eng.push_tokens(i, torch.randint(0, 6561, (utterance_tokens,)).tolist(), last=True)
    step_transient, steps, reserved_peak, event_steps = 0, 0, 0, []
    t1 = time.perf_counter()
    with torch.no_grad():
        while eng.num_streams:
            a0, e0 = torch.cuda.memory_allocated(), _events()
            torch.cuda.reset_peak_memory_stats()
            eng.step()
            torch.cuda.synchronize()
            a1 = torch.cuda.memory_allocated()
            step_transient = max(step_transient, torch.cuda.max_memory_allocated() - max(a0, a1))
            reserved_peak = max(reserved_peak, torch.cuda.max_memory_reserved())
            flushed = _delta(e0)
            if any(flushed.values()):  # which step made the allocator flush its cache
                event_steps.append({"step": steps, "held_before_gib": a0 / 2**30} | flushed)
            steps += 1
    return {
        "max_streams": max_streams,
        "cache_mib": cfg.cache_mib,  # None: every slot at the longest prompt
        "graphs": graphs,
        "warmup_s": warm_s,
        "warmup_events": warm_events,
        "warmup_transient_mib": warm_transient / 2**20,
        "burst_events": _delta(events),
        "burst_steps": steps,
        "burst_s": time.perf_counter() - t1,
        "burst_step_transient_mib": step_transient / 2**20,
        "held_after_warmup_gib": held / 2**30,
        # reserved beyond held: graph pools and the allocator's cached blocks
        "reserved_after_warmup_gib": reserved_after_warmup / 2**30,
        "reserved_peak_gib": reserved_peak / 2**30,
        "burst_event_steps": event_steps,
        "device_total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "expandable_segments": expandable_segments_in_use(),
        "graph_stats": eng.graph_stats(),
    }


TF32_STAGES = {"off": (False,), "on": (True,), "both": (False, True)}


def stage_name(tf32: bool) -> str:
    """The JSON key of the stages run with TF32 on or off."""
    return "tf32_on" if tf32 else "tf32_off"


def run(models: Code2WavModels, max_streams: int, max_prompt_frames: int,
        batches: list[int] | None, bound: int, every_nth_length: int = 1,
        bounded: bool = True, with_burst: bool = True,
        per_voice_pool: bool = False, with_sweep: bool = True,
        tf32_modes: tuple[bool, ...] = (False, True),
        save: Callable[[dict[str, Any]], None] = lambda measured: None) -> dict[str, Any]:
    """The stages asked for, in order; ``save`` gets everything measured so far after each
    one, so a run cut short by a time limit keeps what it finished (and the whole check, the
    better part of half an hour, can run as ``tf32_modes`` and ``with_sweep`` parts)."""
    out: dict[str, Any] = {}
    calls: list[ConvCall] = []
    if with_sweep:
        t0 = time.perf_counter()
        calls = conv_calls(models, max_prompt_frames, tf32=False)  # shapes do not depend on TF32
        out["shapes"] = {
            "calls": len(calls), "modules": len({c.module for c in calls}),
            "distinct_plans": len(distinct_plans(models, calls)),
            "seconds": time.perf_counter() - t0,
        }
        print(json.dumps({"shapes": out["shapes"]}), flush=True)
        save(out)
        calls = calls[::every_nth_length]
    for tf32 in tf32_modes:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        name = stage_name(tf32)
        stage: dict[str, Any] = {}
        out[name] = stage
        if with_sweep:
            t0 = time.perf_counter()
            rows = sweep(models, calls, batches or list(range(1, max_streams + 1)), tf32, bounded)
            stage["sweep"] = sweep_summary(rows, bound) | {"seconds": time.perf_counter() - t0}
            save(out)
        if with_burst:
            stage["burst"] = burst(models, max_streams, tf32, bounded,
                                   per_voice_pool=per_voice_pool)
            save(out)
        print(json.dumps({name: {k: _brief(v) for k, v in stage.items()}}), flush=True)
    return out


def _brief(stage: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stage.items() if k not in ("over_bound_or_events", "graph_stats")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--generate", choices=("real", "tiny"), default="real")
    p.add_argument("--max-streams", type=int, default=64)
    p.add_argument("--max-prompt-frames", type=int, default=EngineConfig().max_prompt_frames)
    p.add_argument("--batches", default="", help="comma-separated; default 1..max-streams")
    p.add_argument("--every-nth-length", type=int, default=1,
                   help="sweep every Nth conv call only (a quick look; the bound needs 1)")
    p.add_argument("--no-bound", action="store_true",
                   help="let cuDNN run fp32 convs too: the figures without the engine's bound")
    p.add_argument("--skip-burst", action="store_true")
    p.add_argument("--skip-sweep", action="store_true",
                   help="the bursts alone (the sweep can run in a command of its own)")
    p.add_argument("--tf32", choices=tuple(TF32_STAGES), default="both",
                   help="the stages with TF32 off, on, or both (one after the other)")
    p.add_argument("--burst-pool", choices=("longest", "per-voice"), default="longest",
                   help="the burst engine's key/value pool: every slot at the longest prompt, "
                        "or sized for the burst's own voices")
    p.add_argument("--campplus-onnx", type=Path, default=None)
    p.add_argument("--git-rev", default="")
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args(argv)
    if a.skip_sweep and a.skip_burst:
        raise SystemExit("--skip-sweep and --skip-burst leave nothing to measure: drop one")
    use_serving_allocator()
    if not torch.cuda.is_available():
        raise SystemExit("conv_memory measures CUDA memory: run it on a machine with a GPU")
    bound = OP_MEMORY_BOUND_BYTES
    with tempfile.TemporaryDirectory() as tmp:
        dims = REAL if a.generate == "real" else TINY
        write_random_checkpoint(tmp, dims, campplus_onnx=a.campplus_onnx)
        models = load_code2wav(tmp, "cuda")
    batches = [int(b) for b in a.batches.split(",") if b]
    header = {
        "git_rev": a.git_rev,
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
        "python": platform.python_version(),
        "dims": a.generate,
        "bound_bytes": bound,
        "bounded_convs": not a.no_bound,
        "allocator_conf": os.environ.get(ALLOC_CONF_ENV_NEW, os.environ.get(ALLOC_CONF_ENV)),
        "every_nth_length": a.every_nth_length,
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)

    def save(measured: dict[str, Any]) -> None:
        a.json.write_text(json.dumps(header | measured, indent=1) + "\n")

    save(run(models, a.max_streams, a.max_prompt_frames, batches, bound, a.every_nth_length,
             bounded=not a.no_bound, with_burst=not a.skip_burst,
             per_voice_pool=a.burst_pool == "per-voice", with_sweep=not a.skip_sweep,
             tf32_modes=TF32_STAGES[a.tf32], save=save))

if __name__ == "__main__":
    main()
