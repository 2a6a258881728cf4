"""Reading the official client's result files (`--save-result --save-detailed`).

The file is one JSON object: vLLM's run header (`date`, `backend`, `model_id`, `num_prompts`,
`request_rate`, `max_concurrency`, ...) merged with vLLM-Omni's metrics (`completed`,
`failed`, `duration`, `audio_throughput`, `total_audio_duration_s`, `num_audio_ttfp_samples`,
`mean_audio_ttfp_ms`, `p95_audio_ttfp_ms`, `mean_audio_rtf`, ...) and, with --save-detailed,
per-request lists such as `errors`. Percentile keys exist only when the metric had samples,
and quality runs add `seed_tts_*` keys. Anything else is refused, naming the file and key,
because a silently misread file would publish a wrong number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND = "openai-chat-omni"


class ResultFormatError(ValueError):
    """A result file that is not in the format this program understands."""

    def __init__(self, path: Path | str, key: str, problem: str) -> None:
        super().__init__(f"{path}: key {key!r}: {problem}")
        self.path = str(path)
        self.key = key


@dataclass(frozen=True, slots=True)
class RunResult:
    path: str
    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    audio_throughput: float
    total_audio_s: float
    ttfp_samples: int
    mean_ttfp_ms: float | None
    p95_ttfp_ms: float | None
    rtf_samples: int
    mean_rtf: float | None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WerItem:
    utterance_id: str
    wer: float | None
    reference: str | None
    audio_path: str | None
    error: str | None = None
    sim: float | None = None


@dataclass(frozen=True, slots=True)
class WerResult:
    mean_wer: float | None
    evaluated: int
    request_failed: int
    no_pcm: int
    asr_failed: int
    saved_audio: int
    items: tuple[WerItem, ...] = field(default_factory=tuple)
    # The evaluator's own speaker similarity (its WavLM), when it was turned on.
    sim_mean: float | None = None
    sim_evaluated: int = 0


def load_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultFormatError(path, "(file)", f"cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFormatError(path, "(document)", f"not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ResultFormatError(path, "(document)", "top level is not an object")
    return data


def _int(data: dict[str, Any], path: Path, key: str) -> int:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        raise ResultFormatError(path, key, "missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResultFormatError(path, key, f"expected a non-negative integer, got {value!r}")
    return value


def _num(data: dict[str, Any], path: Path, key: str) -> float:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        raise ResultFormatError(path, key, "missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ResultFormatError(path, key, f"expected a finite number, got {value!r}")
    return float(value)


_MISSING: Any = object()


def parse_run(path: Path, *, expect_concurrency: int | None = None) -> RunResult:
    """Parse one timing or quality result file; raise ResultFormatError when not understood."""
    data = load_json(path)
    backend = data.get("backend", data.get("endpoint_type", _MISSING))
    if backend is _MISSING:
        raise ResultFormatError(path, "backend", "missing")
    if backend != BACKEND:
        raise ResultFormatError(path, "backend", f"expected {BACKEND!r}, got {backend!r}")
    conc = _int(data, path, "max_concurrency")
    if expect_concurrency is not None and conc != expect_concurrency:
        raise ResultFormatError(path, "max_concurrency", f"expected {expect_concurrency}")
    num_prompts = _int(data, path, "num_prompts")
    completed = _int(data, path, "completed")
    failed = _int(data, path, "failed")
    if completed + failed != num_prompts:
        raise ResultFormatError(
            path, "completed", f"completed+failed={completed + failed} != num_prompts={num_prompts}"
        )
    ttfp_n = _int(data, path, "num_audio_ttfp_samples")
    rtf_n = _int(data, path, "num_audio_rtf_samples")
    return RunResult(
        path=str(path),
        concurrency=conc,
        num_prompts=num_prompts,
        completed=completed,
        failed=failed,
        duration_s=_num(data, path, "duration"),
        request_throughput=_num(data, path, "request_throughput"),
        audio_throughput=_num(data, path, "audio_throughput"),
        total_audio_s=_num(data, path, "total_audio_duration_s"),
        ttfp_samples=ttfp_n,
        mean_ttfp_ms=_num(data, path, "mean_audio_ttfp_ms") if ttfp_n else None,
        p95_ttfp_ms=_num(data, path, "p95_audio_ttfp_ms") if ttfp_n else None,
        rtf_samples=rtf_n,
        mean_rtf=_num(data, path, "mean_audio_rtf") if rtf_n else None,
        errors=_errors(data, path, num_prompts),
    )


def _errors(data: dict[str, Any], path: Path, n: int) -> tuple[str, ...]:
    """Distinct non-empty request errors (from --save-detailed), for the failure report."""
    errors = data.get("errors", _MISSING)
    if errors is _MISSING:
        raise ResultFormatError(path, "errors", "missing: the run must use --save-detailed")
    if not isinstance(errors, list) or len(errors) != n:
        raise ResultFormatError(path, "errors", f"expected a list of {n} entries")
    seen: dict[str, None] = {}
    for e in errors:
        if e is not None and not isinstance(e, str):
            raise ResultFormatError(path, "errors", f"entry is not a string: {e!r}")
        if e:
            seen.setdefault(e.strip()[:200], None)
    return tuple(seen)


def parse_wer(path: Path) -> WerResult:
    """The official Seed-TTS WER block of a quality run's result file."""
    data = load_json(path)
    if data.get("seed_tts_eval_setup_error"):
        raise ResultFormatError(
            path, "seed_tts_eval_setup_error", str(data["seed_tts_eval_setup_error"])[:200]
        )
    if data.get("seed_tts_content_metric", _MISSING) != "wer":
        raise ResultFormatError(path, "seed_tts_content_metric", "expected 'wer' (quality run?)")
    evaluated = _int(data, path, "seed_tts_content_evaluated")
    mean = data.get("seed_tts_content_error_mean", _MISSING)
    if mean is _MISSING or (evaluated and mean is None):
        raise ResultFormatError(path, "seed_tts_content_error_mean", "missing")
    if mean is not None:
        mean = _num(data, path, "seed_tts_content_error_mean")
    return WerResult(
        mean_wer=mean,
        evaluated=evaluated,
        request_failed=_int(data, path, "seed_tts_request_failed"),
        no_pcm=_int(data, path, "seed_tts_no_pcm"),
        asr_failed=_int(data, path, "seed_tts_asr_failed"),
        saved_audio=int(data.get("seed_tts_saved_audio", 0) or 0),
        items=_wer_items(data, path),
        **_official_sim(data, path),
    )


def _official_sim(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The evaluator's SIM, refused when it only looks measured: some evaluator versions
    report 0 when their speaker model is off or failed, and a 0 must never pass for a
    similarity (no two recordings of speech have a cosine of exactly 0)."""
    mean = data.get("seed_tts_sim_mean")
    if mean is None:
        return {}
    mean = _num(data, path, "seed_tts_sim_mean")
    evaluated = int(data.get("seed_tts_sim_evaluated") or 0)
    if evaluated == 0 or mean == 0.0:
        raise ResultFormatError(path, "seed_tts_sim_mean", (
            f"{mean:g} over {evaluated} evaluated utterances: the evaluator's speaker model did "
            "not run (SEED_TTS_SIM_EVAL off, or its model failed to load)"))
    if not -1.0 <= mean <= 1.0:
        raise ResultFormatError(path, "seed_tts_sim_mean", f"{mean:g} is not a cosine")
    return {"sim_mean": mean, "sim_evaluated": evaluated}


def _item_sim(row: dict[str, Any], path: Path, key: str) -> float | None:
    sim = row.get("sim")
    if sim is None:
        return None
    if (isinstance(sim, bool) or not isinstance(sim, int | float) or not math.isfinite(sim)
            or not -1.0 <= sim <= 1.0):
        raise ResultFormatError(path, f"{key}.sim", f"expected a cosine, got {sim!r}")
    return float(sim)


def _wer_items(data: dict[str, Any], path: Path) -> tuple[WerItem, ...]:
    raw = data.get("seed_tts_wer_eval_items", _MISSING)
    if raw is _MISSING:
        raise ResultFormatError(
            path, "seed_tts_wer_eval_items", "missing: SEED_TTS_WER_SAVE_ITEMS=1"
        )
    if not isinstance(raw, list):
        raise ResultFormatError(path, "seed_tts_wer_eval_items", "expected a list")
    items = []
    for i, row in enumerate(raw):
        key = f"seed_tts_wer_eval_items[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("utterance_id"), str):
            raise ResultFormatError(path, key, "expected an object with 'utterance_id'")
        wer = row.get("wer")
        if wer is not None and (isinstance(wer, bool) or not isinstance(wer, int | float)):
            raise ResultFormatError(path, f"{key}.wer", f"expected a number, got {wer!r}")
        items.append(
            WerItem(
                utterance_id=row["utterance_id"],
                wer=float(wer) if wer is not None else None,
                reference=row.get("reference_raw"),
                audio_path=row.get("audio_path"),
                error=row.get("error"),
                sim=_item_sim(row, path, key),
            )
        )
    return tuple(items)
