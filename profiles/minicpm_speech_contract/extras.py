"""The Code2Wav connector extras: every key, its type, range and default, and every rule.

A vLLM-Omni deploy config carries the Code2Wav stage's options in the shared-memory
connector's ``extra`` mapping (:data:`EXTRA_PATH`). Three programs read them: the operator
refuses a profile or override before rolling it out, the pod's supervisor refuses a deploy
config before starting the server, and the serving plugin configures the batched engine from
them. All three ask :func:`problems`, so a spec the operator accepts is one the pod starts;
the plugin reads values through :class:`Code2WavExtras`, so a default is written once.

``profiles/schema.json`` carries :func:`json_schema` as ``$defs.code2wavExtra`` for people
and editors reading the schema; a test keeps the copy equal.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .describe import show, type_of

EXTRA_PATH = ("connectors", "connector_of_shared_memory", "extra")

# The batched engine's fixed chunking: it decodes 25 tokens at a time and keeps the
# encoder's 3 lookahead tokens (the engine's config holds the same numbers and checks them).
ENGINE_CHUNK_TOKENS = 25
ENGINE_LOOKAHEAD_TOKENS = 3
# The batched engine's arithmetic for the flow (its encoder and DiT); HiFT stays fp32 in each:
#   fp32: the reference's arithmetic (PCM parity within 1e-4);
#   bf16-cache: keys, values and conv caches in bfloat16, half the slots' memory, read back
#   into fp32 for attention and the convs;
#   bf16: the encoder's and the DiT's weights, activations and caches in bfloat16; the
#   solver's state stays fp32, and the fused kernels compute norms and softmax in fp32.
PRECISIONS = ("fp32", "bf16-cache", "bf16")
# How much estimator cache a stream holds: its prompt (50 mel frames a second, 10 s at most
# unless ref_audio_max_seconds says otherwise), the 100 frames of history the reference keeps
# after it, and one chunk being added (25 + 3 tokens, 2 frames each); two CFG rows of each.
PROMPT_FRAMES_PER_SECOND = 50
ENGINE_MAX_PROMPT_FRAMES = 500
ENGINE_HISTORY_FRAMES = 100
# MiniCPM-o 4.5's Code2Wav DiT: 16 blocks whose attention is 512 wide (8 heads of 64). A
# cached frame of one CFG row holds its keys and values for every solver step and block.
DIT_BLOCKS, DIT_ATTENTION_WIDTH = 16, 512

Kind = Literal["boolean", "integer", "number", "string", "integer-list", "any"]
_MESSAGE_CAP = 200


@dataclass(frozen=True, slots=True)
class Extra:
    """One key: its JSON type and bounds, and who reads it.

    ``user_settable`` is false for the few keys vLLM-Omni reads that a profile may not set
    (per-request or build-time options); a deploy config may still carry them.
    ``batched_value`` is the only value the batched engine serves, with the reason.
    """

    name: str
    kind: Kind
    description: str
    reader: Literal["runtime", "vllm-omni", "both"] = "runtime"
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    choices: tuple[Any, ...] | None = None
    max_items: int | None = None
    user_settable: bool = True
    batched_value: tuple[Any, str] | None = None

    def schema(self) -> dict[str, Any]:
        if self.kind == "integer-list":
            out: dict[str, Any] = {"description": self.description, "type": "array",
                                   "minItems": 1}
            if self.max_items is not None:
                out["maxItems"] = self.max_items
            out["uniqueItems"] = True
            out["items"] = {"type": "integer", "enum": list(self.choices or ())}
            return out
        out = {"description": self.description, "type": self.kind}
        if self.choices is not None:
            out["enum"] = list(self.choices)
        for word, value in (("minimum", self.minimum), ("exclusiveMinimum",
                            self.exclusive_minimum), ("maximum", self.maximum)):
            if value is not None:
                out[word] = value
        return out


EXTRAS: tuple[Extra, ...] = (
    Extra("batched_code2wav", "boolean",
          "Use the batched Code2Wav runtime; false leaves vLLM-Omni's own Code2Wav path "
          "untouched."),
    Extra("micro_batch_size", "integer",
          "Streams decoded together in one Code2Wav solve.", minimum=1, maximum=64),
    Extra("cfm_graph_precapture", "boolean",
          "Capture the CFM CUDA graphs at start-up instead of lazily while serving."),
    Extra("cfm_max_graphs", "integer",
          "CUDA-graph budget shared by decode, setup and HiFT shapes.", minimum=1, maximum=256),
    Extra("token2wav_allow_tf32", "boolean",
          "Let the flow model's matmuls and convolutions use TF32 (faster, not bit-exact).",
          reader="both"),
    Extra("token2wav_float16", "boolean",
          "vLLM-Omni's own Code2Wav in float16.", reader="vllm-omni",
          batched_value=(False, "the batched engine computes in float32 only")),
    Extra("reference_prep_workers", "integer",
          "Host workers preparing reference voices ahead of chunk 0; 0 prepares inline.",
          minimum=0, maximum=32),
    Extra("reference_cache_size", "integer",
          "Prepared reference voices kept (least recently used evicted first).",
          minimum=1, maximum=4096),
    Extra("campplus_backend", "string", "Where the CAM++ speaker embedding runs.",
          choices=("cuda", "onnxruntime", "tensorrt")),
    Extra("setup_graph_batch_sizes", "integer-list",
          "Batch sizes of the cold-reference setup graphs; each at most micro_batch_size.",
          choices=(1, 2, 4, 8), max_items=4),
    Extra("enable_cfm_graph", "boolean",
          "Replay the flow model's solves as CUDA graphs.", reader="both"),
    Extra("enable_hift_graph", "boolean",
          "Replay the HiFT vocoder as CUDA graphs.", reader="both"),
    Extra("cfm_graph_bucket_frames", "integer",
          "Pad CFM frame counts up to a multiple of this to share graphs; 0 or 1 disables "
          "padding.", reader="vllm-omni", minimum=0, maximum=256),
    Extra("codec_chunk_frames", "integer",
          "Speech tokens decoded per chunk.", reader="vllm-omni", minimum=1, maximum=200,
          batched_value=(ENGINE_CHUNK_TOKENS,
                         f"the engine decodes chunks of {ENGINE_CHUNK_TOKENS} tokens")),
    Extra("codec_left_context_frames", "integer",
          "Lookahead tokens kept back until the next chunk.", reader="vllm-omni",
          minimum=0, maximum=100,
          batched_value=(ENGINE_LOOKAHEAD_TOKENS,
                         f"the engine keeps exactly {ENGINE_LOOKAHEAD_TOKENS} lookahead tokens")),
    Extra("token2wav_n_timesteps", "integer",
          "Flow-matching solver steps per chunk. In bf16 on random weights at real dims, "
          "log-mel SNR against fp32 at 10 steps: 63.4 dB at 10, 56.8 at 5, 51.5 at 3.",
          reader="both", minimum=1, maximum=50),
    Extra("token2wav_precision", "string",
          "The batched engine's arithmetic for the flow: fp32; bf16-cache (keys, values and "
          "conv caches in bfloat16, half their memory; compute stays fp32); or bf16 (the "
          "encoder and the DiT in bfloat16, caches too). HiFT stays fp32 in every mode. "
          "Log-mel SNR against fp32 on random weights at real dims: bf16-cache 71.7 dB "
          "(fp32's own floor), bf16 63.4 dB.",
          choices=PRECISIONS),
    Extra("token2wav_cache_mib", "integer",
          "Device memory (MiB) for the batched engine's estimator keys and values. Each stream "
          "takes what its own prompt needs and waits when the pool is full; unset, the pool "
          "holds every stream at the longest prompt allowed. A stream takes 2 x (prompt frames "
          "+ 156) frames of 640 KiB at 10 steps in fp32, half that in bf16-cache and bf16.",
          minimum=1, maximum=1048576),
    Extra("token2wav_runtime_prompt_cache_size", "integer",
          "Prepared prompts vLLM-Omni's own Code2Wav keeps.", reader="vllm-omni",
          minimum=0, maximum=4096),
    Extra("token2wav_setup_cache_size", "integer",
          "Voices whose set-up caches are kept for reuse; 0 turns the cache off.",
          reader="both", minimum=0, maximum=4096),
    Extra("code2wav_min_batch_size", "integer",
          "Fewest requests vLLM-Omni gathers before a Code2Wav step.", reader="vllm-omni",
          minimum=1, maximum=64),
    Extra("code2wav_initial_batch_size", "integer",
          "0, or at least code2wav_min_batch_size.", reader="vllm-omni", minimum=0, maximum=64),
    Extra("ref_audio_max_seconds", "number",
          "Reference audio is cut to this many seconds.", reader="both",
          exclusive_minimum=0, maximum=30),
    # vLLM-Omni 0.30.0 reads these too (its Code2Wav and stage-1 hook); a profile may not set
    # them, a hand-written deploy config may. The vLLM-Omni lane checks the list.
    *(Extra(name, "any", "vLLM-Omni's own option; vLLM-Omni checks it.", reader="vllm-omni",
            user_settable=False)
      for name in ("code2wav_bfloat16_attention_cache", "hift_graph_capture_batch_sizes",
                   "prompt_cache_id", "prompt_wav", "token2wav_trt", "token2wav_trt_dtype",
                   "token2wav_trt_max_batch")),
)
BY_NAME: Mapping[str, Extra] = {extra.name: extra for extra in EXTRAS}
SETTABLE = tuple(extra.name for extra in EXTRAS if extra.user_settable)
VLLM_OMNI_ONLY = tuple(extra.name for extra in EXTRAS if not extra.user_settable)


@dataclass(frozen=True, slots=True)
class Code2WavExtras:
    """The extras with every default filled in; what the serving plugin reads.

    ``None`` means "not set": the engine's own sizing (10 s of prompt, no voice-count bound
    on its setup cache), or vLLM-Omni's own default for the keys only it reads.
    """

    batched_code2wav: bool = False
    micro_batch_size: int = 4
    cfm_graph_precapture: bool = False
    cfm_max_graphs: int = 32
    token2wav_allow_tf32: bool = False
    token2wav_float16: bool = False
    reference_prep_workers: int = 2
    reference_cache_size: int = 16
    campplus_backend: str = "cuda"
    setup_graph_batch_sizes: tuple[int, ...] = (1,)
    enable_cfm_graph: bool = True
    enable_hift_graph: bool = True
    cfm_graph_bucket_frames: int | None = None
    codec_chunk_frames: int = ENGINE_CHUNK_TOKENS
    codec_left_context_frames: int = ENGINE_LOOKAHEAD_TOKENS
    token2wav_n_timesteps: int = 10
    token2wav_precision: str = "fp32"
    token2wav_cache_mib: int | None = None
    token2wav_runtime_prompt_cache_size: int | None = None
    token2wav_setup_cache_size: int | None = None
    code2wav_min_batch_size: int = 1
    code2wav_initial_batch_size: int = 0
    ref_audio_max_seconds: float | None = None

    @classmethod
    def of(cls, extras: Mapping[str, Any] | None) -> Code2WavExtras:
        """The settings of extras that :func:`problems` accepts (unknown keys are ignored)."""
        given = {f.name: extras[f.name] for f in dataclasses.fields(cls)
                 if extras and extras.get(f.name) is not None}
        if "setup_graph_batch_sizes" in given:
            given["setup_graph_batch_sizes"] = tuple(given["setup_graph_batch_sizes"])
        return cls(**given)

    @property
    def max_prompt_frames(self) -> int:
        """Frames of the longest prompt the engine takes: ``ref_audio_max_seconds`` of mel
        (rounded up to whole tokens), or 10 s."""
        if self.ref_audio_max_seconds is None:
            return ENGINE_MAX_PROMPT_FRAMES
        frames = int(-(-self.ref_audio_max_seconds * PROMPT_FRAMES_PER_SECOND // 1))
        return max(2, frames + frames % 2)

    def cache_mib_needed(self) -> int:
        """The least ``token2wav_cache_mib`` that holds one stream of the longest prompt."""
        return cache_mib_for(1, self.max_prompt_frames, self.token2wav_n_timesteps,
                             self.token2wav_precision)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}


DEFAULTS = Code2WavExtras()


def kv_frame_bytes(n_timesteps: int, precision: str, blocks: int = DIT_BLOCKS,
                   width: int = DIT_ATTENTION_WIDTH) -> int:
    """Bytes of one cached frame of one CFG row: keys and values of every step and block."""
    return 2 * n_timesteps * blocks * width * (4 if precision == "fp32" else 2)


def stream_cache_frames(prompt_frames: int) -> int:
    """Cached frames of one CFG row of a stream of this prompt: the prompt, the history kept
    after it and one chunk being added."""
    chunk = 2 * (ENGINE_CHUNK_TOKENS + ENGINE_LOOKAHEAD_TOKENS)
    return prompt_frames + ENGINE_HISTORY_FRAMES + chunk


def cache_mib_for(streams: int, prompt_frames: int, n_timesteps: int, precision: str,
                  blocks: int = DIT_BLOCKS, width: int = DIT_ATTENTION_WIDTH) -> int:
    """The ``token2wav_cache_mib`` that holds ``streams`` streams of ``prompt_frames``-frame
    prompts at once (both CFG rows of each): size it by the voices served, not the longest."""
    return cache_mib_for_frames(streams * 2 * stream_cache_frames(prompt_frames), n_timesteps,
                                precision, blocks, width)


def cache_mib_for_frames(frames: int, n_timesteps: int, precision: str,
                         blocks: int = DIT_BLOCKS, width: int = DIT_ATTENTION_WIDTH) -> int:
    """The least ``token2wav_cache_mib`` that holds ``frames`` key/value frames (rows of
    prompts of any mix of lengths, each :func:`stream_cache_frames` per CFG row)."""
    return -(-frames * kv_frame_bytes(n_timesteps, precision, blocks, width) // 2**20)


class Problem(NamedTuple):
    """What is wrong with the extras: the keys involved (the likeliest culprit first; empty
    for the mapping itself), one sentence saying what, one saying how to fix it."""

    keys: tuple[str, ...]
    message: str
    fix: str

    @property
    def key(self) -> str:
        return self.keys[0] if self.keys else ""

    def line(self) -> str:
        where = ".".join((*EXTRA_PATH, self.key)) if self.key else ".".join(EXTRA_PATH)
        return f"{where}: {self.message}. {self.fix}"


def problems(extras: Any, *, vllm_omni_internal: bool = False,
             other_keys: bool = False) -> Iterator[Problem]:
    """Every problem with ``extras``, each key's own first, then the rules across keys, then
    what the batched engine refuses. ``vllm_omni_internal`` admits the keys a profile may not
    set (the pod reads hand-written deploy configs too); ``other_keys`` passes over keys this
    contract does not know, for the extras vLLM-Omni hands its stage, which carry its base
    config's own connector settings beside the overlay's."""
    if not isinstance(extras, Mapping):
        yield Problem((), f"must be a mapping, got {type_of(extras)}",
                      "Write the extras as a mapping of option names to values.")
        return
    allowed = set(BY_NAME) if vllm_omni_internal else set(SETTABLE)
    bad: set[str] = set()
    for key in sorted(extras, key=str):
        if key not in allowed:
            if other_keys and key not in BY_NAME:
                continue
            bad.add(str(key))
            yield _unknown(str(key), sorted(allowed))
            continue
        problem = _value_problem(BY_NAME[key], extras[key])
        if problem is not None:
            bad.add(key)
            yield problem
    if bad:
        return  # the rules below read values of the right type only
    yield from _rules(Code2WavExtras.of(extras), extras)


def first_problem(extras: Any, *, vllm_omni_internal: bool = False,
                  other_keys: bool = False) -> Problem | None:
    return next(problems(extras, vllm_omni_internal=vllm_omni_internal, other_keys=other_keys),
                None)


def json_schema() -> dict[str, Any]:
    """``$defs.code2wavExtra`` of ``profiles/schema.json``: the keys a profile may set."""
    return {
        "$comment": "Generated from minicpm_speech_contract/extras.py; change it there.",
        "description": "Options the Code2Wav stage reads from the connector's extra mapping:"
                       " the batched Code2Wav runtime's own keys, then vLLM-Omni's.",
        "type": "object",
        "additionalProperties": False,
        "properties": {e.name: e.schema() for e in EXTRAS if e.user_settable},
    }


# --- checks --------------------------------------------------------------------------


def _unknown(key: str, allowed: list[str]) -> Problem:
    guess = difflib.get_close_matches(key, allowed, n=1)
    fix = f"Rename it to {guess[0]!r} or remove it" if guess else "Remove it"
    return Problem((key,), f"unknown key {_cap(repr(key))}",
                   f"{fix}; the keys allowed here are: {', '.join(allowed)}.")


def _value_problem(extra: Extra, value: Any) -> Problem | None:
    if extra.kind == "any":
        return None
    shown = _cap(show(value))
    if not _has_kind(value, extra.kind):
        word = {"integer-list": "list of integers", "number": "number"}.get(extra.kind,
                                                                             extra.kind)
        return Problem((extra.name,), f"wrong type: expected {word}, got {type_of(value)} "
                       f"{shown}", _type_fix(extra))
    if extra.kind == "integer-list":
        if not value or (extra.max_items is not None and len(value) > extra.max_items):
            return Problem((extra.name,), f"has {len(value)} items",
                           f"Give it 1 to {extra.max_items} items.")
        if len(set(value)) != len(value):
            return Problem((extra.name,), "lists a value more than once",
                           "List each value once.")
        wrong = [v for v in value if extra.choices and v not in extra.choices]
        if wrong:
            return Problem((extra.name,), f"{show(wrong[0])} is not an allowed value",
                           f"Use values from: {', '.join(map(show, extra.choices or ()))}.")
        return None
    if extra.choices is not None and value not in extra.choices:
        return Problem((extra.name,), f"{shown} is not an allowed value",
                       f"Use one of: {', '.join(map(show, extra.choices))}.")
    low, high, above = extra.minimum, extra.maximum, extra.exclusive_minimum
    if (low is not None and value < low) or (high is not None and value > high) or (
            above is not None and value <= above):
        return Problem((extra.name,), f"out of range: {shown}",
                       f"Set it to a value {_range_words(extra)}.")
    return None


def _rules(settings: Code2WavExtras, given: Mapping[str, Any]) -> Iterator[Problem]:
    micro = settings.micro_batch_size
    too_big = [size for size in settings.setup_graph_batch_sizes if size > micro]
    if too_big:
        yield Problem(
            ("setup_graph_batch_sizes", "micro_batch_size"),
            f"setup graph batch size {max(too_big)} is larger than micro_batch_size {micro}",
            "Drop setup graph batch sizes above micro_batch_size or raise micro_batch_size;"
            " such graphs never run and use up the CUDA-graph budget.")
    cache, needed = settings.token2wav_cache_mib, settings.cache_mib_needed()
    if cache is not None and cache < needed:
        yield Problem(
            ("token2wav_cache_mib", "ref_audio_max_seconds", "token2wav_n_timesteps"),
            f"token2wav_cache_mib {cache} cannot hold one stream of the longest prompt "
            f"({settings.max_prompt_frames} frames at {settings.token2wav_n_timesteps} steps, "
            f"{settings.token2wav_precision}), which needs {needed}",
            f"Raise token2wav_cache_mib to at least {needed}, or lower ref_audio_max_seconds.")
    initial, minimum = settings.code2wav_initial_batch_size, settings.code2wav_min_batch_size
    if initial and initial < minimum:
        yield Problem(
            ("code2wav_initial_batch_size", "code2wav_min_batch_size"),
            f"code2wav_initial_batch_size {initial} is below code2wav_min_batch_size {minimum}",
            "Set code2wav_initial_batch_size to 0 or to at least code2wav_min_batch_size.")
    if settings.batched_code2wav:
        for extra in EXTRAS:
            if extra.batched_value is None or extra.name not in given:
                continue
            allowed, why = extra.batched_value
            if given[extra.name] != allowed:
                yield Problem(
                    (extra.name, "batched_code2wav"),
                    f"{extra.name}={show(given[extra.name])} is not supported with "
                    f"batched_code2wav: {why}",
                    f"Remove {extra.name} or set it to {show(allowed)}, or turn "
                    "batched_code2wav off.")


def _has_kind(value: Any, kind: Kind) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, int | float)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer-list":
        return isinstance(value, list | tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    return False


def _type_fix(extra: Extra) -> str:
    if extra.kind == "boolean":
        return "Set it to true or false, without quotes."
    if extra.kind in ("integer", "number"):
        whole = "a whole number" if extra.kind == "integer" else "a number"
        return f"Set it to {whole} {_range_words(extra)}, without quotes."
    if extra.kind == "integer-list":
        return f"Write it as a list of values from: {', '.join(map(show, extra.choices or ()))}."
    if extra.choices:
        return f"Set it to one of: {', '.join(map(show, extra.choices))}."
    return "Set it to a string."


def _range_words(extra: Extra) -> str:
    low, high, above = extra.minimum, extra.maximum, extra.exclusive_minimum
    if low is not None and high is not None:
        return f"from {show(low)} to {show(high)}"
    if above is not None and high is not None:
        return f"above {show(above)} and at most {show(high)}"
    return "in range"


def _cap(text: str) -> str:
    return text if len(text) <= _MESSAGE_CAP else text[: _MESSAGE_CAP - 3] + "..."
