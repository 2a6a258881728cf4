"""The official benchmark protocol as data: the client command, its environment, the run plan.

Everything here is pure: no process is started and no file is read. The values mirror the
contract (`benchmark-protocol.md`) flag by flag so the published numbers stay comparable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

CONCURRENCIES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
NUM_PROMPTS = 64
WARMUP_PROMPTS = 16
WARMUP_CONCURRENCY = 16
QUALITY_CONCURRENCY = 8
MEASURED_REPEATS = 2
MAX_REPEATS = 8
SEED = 42
OUTPUT_LEN = 256
SYSTEM_PROMPT = "Please read the following text out loud in English."
PERCENTILE_METRICS = "ttft,tpot,itl,e2el,audio_ttfp,audio_rtf,audio_duration"
METRIC_PERCENTILES = "50,95,99"

# Per-stage sampling: Thinker (text), Talker (codec tokens), Code2Wav.
EXTRA_BODY: dict[str, Any] = {
    "modalities": ["text", "audio"],
    "chat_template_kwargs": {"enable_thinking": False, "use_tts_template": True},
    "sampling_params_list": [
        {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": 256,
            "seed": 42,
            "detokenize": True,
            "repetition_penalty": 1.0,
        },
        {
            "temperature": 0.8,
            "top_p": 0.85,
            "top_k": 25,
            "max_tokens": 2048,
            "min_tokens": 50,
            "seed": 42,
            "detokenize": False,
            "repetition_penalty": 1.05,
        },
        {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 65536, "detokenize": True},
    ],
}

TIMING_ENV: dict[str, str] = {
    "SEED_TTS_WER_EVAL": "0",
    "SEED_TTS_SIM_EVAL": "0",
    "SEED_TTS_UTMOS_EVAL": "0",
}

Mode = Literal["dedicated", "maintenance", "live"]
RunKind = Literal["warmup", "discard", "measured", "quality"]
MODES: tuple[str, ...] = ("dedicated", "maintenance", "live")

_ARM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,15}$")
_RESULT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json$")


class ProtocolError(ValueError):
    """An input that would make the run deviate from the protocol."""


def extra_body_json() -> str:
    """The `--extra-body` value, serialised once so every run sends identical bytes."""
    return json.dumps(EXTRA_BODY, separators=(", ", ": "))


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """Where the client points: the server, the served model name, tokenizer and dataset."""

    base_url: str
    model: str
    tokenizer: str
    dataset_root: str
    command_prefix: tuple[str, ...] = ("vllm",)

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+$", self.base_url):
            raise ProtocolError(f"base_url must be http(s)://HOST:PORT, got {self.base_url!r}")
        for name in ("model", "tokenizer", "dataset_root"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ProtocolError(f"{name} must be a non-empty string")
        if not self.command_prefix or not all(
            isinstance(p, str) and p for p in self.command_prefix
        ):
            raise ProtocolError("command_prefix must be a non-empty list of strings")


def build_client_command(
    target: ClientTarget,
    *,
    num_prompts: int,
    concurrency: int,
    result_dir: str,
    result_filename: str,
) -> list[str]:
    """The exact `vllm bench serve --omni` argv of one run, in the protocol's flag order."""
    check_run_shape(num_prompts, concurrency)
    if not result_dir:
        raise ProtocolError("result_dir must be non-empty")
    if not _RESULT_NAME.match(result_filename):
        raise ProtocolError(f"result_filename must be a plain NAME.json, got {result_filename!r}")
    return [
        *target.command_prefix,
        "bench", "serve", "--omni", "--backend", "openai-chat-omni",
        "--base-url", target.base_url, "--endpoint", "/v1/chat/completions",
        "--model", target.model, "--tokenizer", target.tokenizer, "--trust-remote-code",
        "--dataset-name", "seed-tts", "--dataset-path", target.dataset_root,
        "--seed-tts-locale", "en",
        "--seed-tts-system-prompt", SYSTEM_PROMPT,
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--no-oversample", "--disable-shuffle",
        "--seed", str(SEED), "--output-len", str(OUTPUT_LEN),
        "--num-warmups", "0", "--request-rate", "inf",
        "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--extra-body", extra_body_json(),
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", METRIC_PERCENTILES,
        "--save-result", "--save-detailed",
        "--result-dir", result_dir, "--result-filename", result_filename,
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """How many requests the runs send, and how often a measurement repeats.

    The protocol's counts are the defaults, and only they give figures comparable with the
    published ones. Smaller counts exist for machines where a request takes seconds of CPU (a
    test of the whole path, not a measurement); the client takes the first N rows of the
    ordered subset, so no count may exceed its 64 rows.
    """

    measured: int = NUM_PROMPTS
    warmup: int = WARMUP_PROMPTS
    repeats: int = MEASURED_REPEATS

    def __post_init__(self) -> None:
        for name, value, hi in (("measured", self.measured, NUM_PROMPTS),
                                ("warmup", self.warmup, NUM_PROMPTS),
                                ("repeats", self.repeats, MAX_REPEATS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ProtocolError(f"{name} must be an integer in [1, {hi}], got {value!r}")

    @property
    def is_protocol(self) -> bool:
        return self == PROTOCOL_COUNTS


PROTOCOL_COUNTS = RequestCounts()


def check_run_shape(num_prompts: int, concurrency: int) -> None:
    """Request counts within the ordered subset, and only the protocol's concurrencies."""
    if isinstance(num_prompts, bool) or not 1 <= num_prompts <= NUM_PROMPTS:
        raise ProtocolError(f"num_prompts must be in [1, {NUM_PROMPTS}], got {num_prompts!r}")
    if concurrency not in CONCURRENCIES:
        raise ProtocolError(f"concurrency must be one of {list(CONCURRENCIES)}, got {concurrency}")


def timing_env(base: Mapping[str, str]) -> dict[str, str]:
    """Environment of a timing run: all Seed-TTS evaluators off so they cost no client time."""
    return {**base, **TIMING_ENV}


def quality_env(
    base: Mapping[str, str], *, whisper_model: str, audio_dir: str, device: str = "cuda:0",
    speaker_model: str | None = None,
) -> dict[str, str]:
    """Environment of a quality run: the official WER evaluator on, items and WAVs kept; and
    with ``speaker_model`` (a Hugging Face WavLM folder), the evaluator's own SIM too."""
    if not whisper_model:
        raise ProtocolError("whisper_model (path to openai/whisper-large-v3) must be set")
    if not audio_dir:
        raise ProtocolError("audio_dir must be set so the generated WAVs are kept")
    if not re.match(r"^(cpu|cuda(:\d+)?)$", device):
        raise ProtocolError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    return {
        **base,
        **TIMING_ENV,
        "SEED_TTS_WER_EVAL": "1",
        "SEED_TTS_WER_SAVE_ITEMS": "1",
        "SEED_TTS_EVAL_DEVICE": device,
        "SEED_TTS_HF_WHISPER_MODEL": whisper_model,
        "SEED_TTS_WER_SAVE_AUDIO_DIR": audio_dir,
        # Off unless its weights are given: by default it would download a model.
        "SEED_TTS_SIM_EVAL": "1" if speaker_model else "0",
        **({"SEED_TTS_WAVLM_MODEL": speaker_model, "SEED_TTS_SIM_DEVICE": device}
           if speaker_model else {}),
    }


@dataclass(frozen=True, slots=True)
class Run:
    """One client invocation; `name` is also its result file stem."""

    name: str
    kind: RunKind
    concurrency: int
    num_prompts: int
    repeat: int = 0

    @property
    def result_filename(self) -> str:
        return f"{self.name}.json"


@dataclass(frozen=True, slots=True)
class Visit:
    """One server start (or, in live mode, one pass against the live server)."""

    arm: str
    index: int
    fresh_server: bool
    runs: tuple[Run, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """The protocol's name for the visit: A1, B1, B2, A2."""
        return f"{self.arm}{self.index}"


def run_stem(arm: str, index: int) -> str:
    # Arm names never contain '.', so file names split back into arm and visit unambiguously.
    return f"{arm}.{index}"


def check_arm_name(name: str) -> str:
    if not isinstance(name, str) or not _ARM_NAME.match(name):
        raise ProtocolError(f"arm name must match {_ARM_NAME.pattern}, got {name!r}")
    return name


def check_concurrencies(values: Sequence[int]) -> tuple[int, ...]:
    """A non-empty, duplicate-free subset of the protocol's concurrencies, kept ascending."""
    if not values:
        raise ProtocolError("concurrencies must not be empty")
    bad = [c for c in values if c not in CONCURRENCIES]
    if bad:
        raise ProtocolError(f"concurrencies must be among {list(CONCURRENCIES)}, got {bad}")
    if len(set(values)) != len(values):
        raise ProtocolError("concurrencies must not repeat")
    return tuple(sorted(values))


def warmup_run(label: str, counts: RequestCounts = PROTOCOL_COUNTS) -> Run:
    # The client takes the first N rows of the ordered subset, so N=16 is the first 16 ids.
    return Run(f"{label}-warmup", "warmup", WARMUP_CONCURRENCY, counts.warmup)


def timing_runs(
    label: str, concurrencies: Sequence[int], counts: RequestCounts = PROTOCOL_COUNTS
) -> tuple[Run, ...]:
    runs: list[Run] = [warmup_run(label, counts)]
    for c in check_concurrencies(concurrencies):
        runs.append(Run(f"{label}-c{c}-discard", "discard", c, counts.measured))
        for r in range(1, counts.repeats + 1):
            runs.append(Run(f"{label}-c{c}-measured{r}", "measured", c, counts.measured, r))
    return tuple(runs)


def visit_order(arms: Sequence[str], mode: str) -> list[tuple[str, int]]:
    """(arm, visit index) pairs: ABBA with a baseline, one visit with a single arm or live."""
    if mode not in MODES:
        raise ProtocolError(f"mode must be one of {list(MODES)}, got {mode!r}")
    names = [check_arm_name(a) for a in arms]
    if len(set(names)) != len(names):
        raise ProtocolError("arm names must be distinct")
    if mode == "live":
        if len(names) != 1:
            raise ProtocolError("live mode measures the serving Service: exactly one arm")
        return [(names[0], 1)]
    if len(names) == 1:
        return [(names[0], 1)]
    if len(names) != 2:
        raise ProtocolError("at most two arms: baseline (A) then candidate (B)")
    a, b = names
    return [(a, 1), (b, 1), (b, 2), (a, 2)]


def plan_sweep(
    arms: Sequence[str],
    mode: str,
    concurrencies: Sequence[int],
    counts: RequestCounts = PROTOCOL_COUNTS,
) -> list[Visit]:
    """The whole timing sweep, visit by visit, run by run."""
    fresh = mode != "live"
    return [
        Visit(arm, i, fresh, timing_runs(run_stem(arm, i), concurrencies, counts))
        for arm, i in visit_order(arms, mode)
    ]


def quality_concurrencies(highest_gated: int) -> tuple[int, ...]:
    """C8 as published first, then C1, then the highest gated concurrency (deduplicated)."""
    if highest_gated not in CONCURRENCIES:
        raise ProtocolError(f"highest gated concurrency must be among {list(CONCURRENCIES)}")
    out: list[int] = []
    for c in (QUALITY_CONCURRENCY, 1, highest_gated):
        if c not in out:
            out.append(c)
    return tuple(out)


def plan_quality(
    arm: str, mode: str, highest_gated: int, counts: RequestCounts = PROTOCOL_COUNTS
) -> Visit:
    """One server start for the quality run: the same warm-up, then 64 requests per C."""
    check_arm_name(arm)
    if mode not in MODES:
        raise ProtocolError(f"mode must be one of {list(MODES)}, got {mode!r}")
    runs = [warmup_run(run_stem(arm, 1), counts)]
    for c in quality_concurrencies(highest_gated):
        runs.append(Run(f"quality-c{c}", "quality", c, counts.measured))
    return Visit(arm, 1, mode != "live", tuple(runs))
