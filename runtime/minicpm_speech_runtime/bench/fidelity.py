"""How far an engine configuration's audio is from the fp32 engine's: the same weights, voices
and tokens, whole streams, HiFT's random source draws fixed on both sides.

Figures per candidate, each an SNR (10 log10 of the reference's energy over the energy of the
difference, pooled over every frame of every stream) and a worst per-stream mean absolute
difference:

* ``flow_*``: what the flow (encoder and DiT) adds to the fixed noise each solve starts from,
  chunk by chunk: the log-mel it hands HiFT less that noise. A change of the flow's precision
  or solver steps moves it first; at random weights the flow adds little, so the whole mel,
  mostly noise, would hide errors that this shows;
* ``mel_*``: the 80-band 24 kHz log-mel of the audio (the flow's own mel definition);
* ``pcm_snr_db``: the PCM samples;
* ``worst_stream_*_snr_db``: the lowest per-stream SNR.

A candidate that computes the same thing scores far above any bound worth setting (identical
arithmetic: infinite); a wrong kernel scores far below (``tests/runtime/test_fidelity.py``). At
random weights HiFT's audio barely follows its mel, so a wrong flow shows in ``flow_*`` only.

Usage::

    python -m minicpm_speech_runtime.bench.fidelity --generate real --voices 32 \\
        --candidate tf32:tf32=1 --candidate steps5:n_timesteps=5 --json fidelity.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..assets import Code2WavModels, load_code2wav
from ..engine import Code2WavEngine, EngineConfig
from ..fixtures.checkpoint import REAL, TINY, write_random_checkpoint
from ..voice.device import PreparedVoice
from ..voice.dsp import prompt_mel_24k
from .engine_bench import new_engine
from .parity import fixed_nsf_noise, make_voices, step_once, utterance

REFERENCE = {"tf32": False}  # the engine every candidate is held against: fp32 throughout
EngineFactory = Callable[[Code2WavModels, dict[str, Any]], Code2WavEngine]


@dataclass(frozen=True, slots=True)
class Energy:
    """One stream's reference energy, difference energy and mean absolute difference."""

    signal: float
    error: float
    l1: float

    @classmethod
    def between(cls, reference: np.ndarray, candidate: np.ndarray) -> Energy:
        if reference.shape != candidate.shape:
            raise ValueError(f"shapes differ: {reference.shape} vs {candidate.shape}")
        want = reference.astype(np.float64)
        diff = candidate.astype(np.float64) - want
        return cls(float(np.sum(want**2)), float(np.sum(diff**2)), float(np.mean(np.abs(diff))))


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream's whole output: what the flow added to its noise [80, frames], and the PCM."""

    flow: np.ndarray
    pcm: np.ndarray


def snr_db(signal: float, error: float) -> float:
    """10 log10(signal / error); infinite when the two are equal."""
    return math.inf if error == 0 else 10 * math.log10(signal / error)


def log_mel(pcm: np.ndarray) -> np.ndarray:
    return prompt_mel_24k(torch.from_numpy(pcm).float()[None])[0].numpy()


def compare(reference: Stream, candidate: Stream) -> dict[str, Energy]:
    """One stream's figures; the two must be the same length."""
    return {
        "flow": Energy.between(reference.flow, candidate.flow),
        "mel": Energy.between(log_mel(reference.pcm), log_mel(candidate.pcm)),
        "pcm": Energy.between(reference.pcm, candidate.pcm),
    }


def summarize(streams: Iterable[dict[str, Energy]]) -> dict[str, float]:
    rows = list(streams)
    if not rows:
        raise ValueError("no streams to compare")
    out: dict[str, float] = {"streams": len(rows)}
    for name in ("flow", "mel", "pcm"):
        parts = [r[name] for r in rows]
        out[f"{name}_snr_db"] = snr_db(sum(p.signal for p in parts), sum(p.error for p in parts))
        out[f"worst_stream_{name}_snr_db"] = min(snr_db(p.signal, p.error) for p in parts)
        if name != "pcm":
            out[f"worst_{name}_l1"] = max(p.l1 for p in parts)
    return out


def default_engine(models: Code2WavModels, overrides: dict[str, Any]) -> Code2WavEngine:
    return new_engine(models, EngineConfig(**overrides))


def stream_audio(
    eng: Code2WavEngine, voices: list[PreparedVoice], utterances: list[list[int]]
) -> list[Stream]:
    """Every stream's whole output; the streams run together, ``max_streams`` at a time."""
    got: dict[Any, list[np.ndarray]] = {}
    mels: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}

    def tap(ids: list[object], chunk_mels: list[torch.Tensor], noise: list[torch.Tensor]) -> None:
        for i, mel, start in zip(ids, chunk_mels, noise, strict=True):
            mels.setdefault(i, []).append((mel.float() - start.float()).cpu().numpy())

    eng.runner.mel_tap = tap
    pending = list(enumerate(zip(voices, utterances, strict=True)))
    with fixed_nsf_noise():
        # until the last waiting stream is done: streams that end in one step can leave the
        # engine empty while others still wait for their cache frames
        while pending or eng.num_streams:
            while pending and eng.admits(pending[0][1][0]):
                i, (voice, tokens) = pending.pop(0)
                eng.add_stream(i, voice)
                eng.push_tokens(i, tokens, last=True)
            step_once(eng, got, reasons)
    bad = {k: v for k, v in reasons.items() if v != "done"}
    if bad or len(got) != len(voices):
        raise RuntimeError(f"streams did not finish: {dict(list(bad.items())[:3])}")
    return [Stream(np.concatenate(mels[i], axis=1), np.concatenate(got[i]))
            for i in range(len(voices))]


def fidelity(
    models: Code2WavModels,
    voices: list[PreparedVoice],
    utterances: list[list[int]],
    candidates: dict[str, dict[str, Any]],
    base: dict[str, Any] | None = None,
    make: EngineFactory = default_engine,
    make_reference: EngineFactory = default_engine,
) -> list[dict[str, Any]]:
    """One row per candidate (``EngineConfig`` overrides on ``base``, built by ``make``) against
    :data:`REFERENCE`. Each engine is freed before the next is built."""
    base = base or {}
    want = stream_audio(make_reference(models, base | REFERENCE), voices, utterances)
    rows = []
    for name, overrides in candidates.items():
        got = stream_audio(make(models, base | overrides), voices, utterances)
        rows.append({"candidate": name, "config": overrides} | summarize(
            compare(w, g) for w, g in zip(want, got, strict=True)
        ))
        del got
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def parse_candidate(text: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,key=value`` with ``EngineConfig`` keys: whole numbers, 0/1 for flags,
    words for the rest (``precision=bf16-cache``)."""
    name, _, body = text.partition(":")
    fields = EngineConfig.__dataclass_fields__
    overrides: dict[str, Any] = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--candidate {text[:80]!r}: {key[:40]!r} is no EngineConfig field")
        kind = str(fields[key].type).split(" |")[0]  # "int | None" reads as int
        parsers: dict[str, Callable[[str], Any]] = {
            "bool": lambda v: bool(int(v)), "int": int, "float": float}
        parse = parsers.get(kind, str)
        try:
            overrides[key] = parse(value)
        except ValueError:
            msg = f"--candidate {text[:80]!r}: {key}={value[:40]!r} is no {kind}"
            raise SystemExit(msg) from None
    if not name:
        raise SystemExit(f"--candidate {text[:80]!r}: give it a name before the colon")
    return name, overrides


_COLUMNS = (  # header, key, format
    ("flow SNR", "flow_snr_db", ".2f"),
    ("worst stream", "worst_stream_flow_snr_db", ".2f"),
    ("worst L1", "worst_flow_l1", ".4f"),
    ("audio mel SNR", "mel_snr_db", ".2f"),
    ("worst L1", "worst_mel_l1", ".4f"),
    ("PCM SNR", "pcm_snr_db", ".2f"),
)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'candidate':16}" + "".join(f" {h:>13}" for h, _, _ in _COLUMNS)]
    for r in rows:
        lines.append(f"{r['candidate']:16}" + "".join(f" {r[k]:>13{f}}" for _, k, f in _COLUMNS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--generate", choices=("real", "tiny"), default="real")
    p.add_argument("--voices", type=int, default=32)
    p.add_argument("--tokens", type=int, default=250, help="tokens per stream")
    p.add_argument("--max-streams", type=int, default=32)
    p.add_argument("--candidate", action="append", default=[], type=parse_candidate)
    p.add_argument("--campplus-onnx", type=Path, default=None)
    p.add_argument("--git-rev", default="")
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args(argv)
    if not a.candidate:
        raise SystemExit("give at least one --candidate name:key=value,...")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:  # the speaker model loads from it when first used
        write_random_checkpoint(tmp, REAL if a.generate == "real" else TINY,
                                campplus_onnx=a.campplus_onnx)
        models = load_code2wav(tmp, device)
        seconds = [3.0 + 7.0 * i / max(1, a.voices - 1) for i in range(a.voices)]
        voices = make_voices(models, seconds)
    utterances = [utterance(a.tokens, 100 + i) for i in range(a.voices)]
    base = {"max_streams": a.max_streams, "micro_batch": min(8, a.max_streams)}
    rows = fidelity(models, voices, utterances, dict(a.candidate), base)
    print(table(rows))
    out = {"git_rev": a.git_rev, "device": torch.cuda.get_device_name() if device == "cuda"
           else "cpu", "dims": a.generate, "voices": a.voices, "tokens": a.tokens,
           "reference": REFERENCE, "rows": rows}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(json_safe(out), indent=1) + "\n")


def json_safe(value: Any) -> Any:
    """JSON has no infinity: identical audio's SNR is written as the string "inf"."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    main()
