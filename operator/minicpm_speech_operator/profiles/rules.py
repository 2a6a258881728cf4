"""Rules across keys, checked on a complete profile: combinations the schema allows but that
would only fail once the server starts or is under load."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from minicpm_speech_contract import extras as extras_contract
from minicpm_speech_contract.extras import EXTRA_PATH
from minicpm_speech_contract.shutdown import TALKER_MAX_MODEL_LEN

from .validation import ProfileError, _get, _PathStep, _render_path, _StageRef

GIB = 1 << 30
# Talker (stage 1) values of vLLM-Omni 0.30.0's minicpmo_4_5.yaml, used where an overlay
# leaves them unset.
_BASE_TALKER_MAX_NUM_SEQS = 4
_BASE_TALKER_MAX_MODEL_LEN = TALKER_MAX_MODEL_LEN
_BASE_TALKER_KV_BYTES = 2 * GIB
# KV bytes per Talker token that every stream of max_model_len tokens must get: the
# published setting holds 8 streams of 4096 tokens in 2 GiB. The Talker cannot be
# preempted and replayed, so its KV cache must hold every admitted stream whole.
_TALKER_KV_BYTES_PER_TOKEN = _BASE_TALKER_KV_BYTES // (8 * _BASE_TALKER_MAX_MODEL_LEN)


class _Problem(NamedTuple):
    paths: tuple[tuple[_PathStep, ...], ...]  # the keys involved, the likeliest culprit first
    message: str
    fix: str


def _check_consistency(doc: dict[str, Any], *, blame: dict[str, Any], field: str) -> None:
    """Refuse combinations vLLM-Omni or the Code2Wav runtime would fail on.

    The key reported is the first involved key that ``blame`` (the document at fault)
    sets, so a user sees the line they wrote.
    """
    for problem in _problems(doc):
        path = next((p for p in problem.paths if _get(blame, p) is not None), problem.paths[0])
        raise ProfileError(field + _render_path(doc, path), problem.message, problem.fix)


def _problems(doc: dict[str, Any]) -> Iterator[_Problem]:
    for stage in doc.get("stages", []):
        sid = _StageRef(stage["stage_id"])
        tokens, seqs = stage.get("max_num_batched_tokens"), stage.get("max_num_seqs")
        if tokens is not None and seqs is not None and tokens < seqs:
            yield _Problem(
                (("stages", sid, "max_num_batched_tokens"), ("stages", sid, "max_num_seqs")),
                f"max_num_batched_tokens {tokens} is smaller than max_num_seqs {seqs}",
                "Raise max_num_batched_tokens to at least max_num_seqs, or vLLM will not start.",
            )

    for problem in extras_contract.problems(_get(doc, EXTRA_PATH, {})):
        yield _Problem(tuple((*EXTRA_PATH, key) for key in problem.keys) or (EXTRA_PATH,),
                       problem.message, problem.fix)

    talker = ("stages", _StageRef(1))
    talker_kv = ("platforms", "cuda", "stages", _StageRef(1), "kv_cache_memory_bytes")
    seqs = _get(doc, (*talker, "max_num_seqs"), _BASE_TALKER_MAX_NUM_SEQS)
    length = _get(doc, (*talker, "max_model_len"), _BASE_TALKER_MAX_MODEL_LEN)
    kv_bytes = _get(doc, talker_kv, _BASE_TALKER_KV_BYTES)
    needed = seqs * length * _TALKER_KV_BYTES_PER_TOKEN
    if kv_bytes < needed:
        yield _Problem(
            (talker_kv, (*talker, "max_num_seqs"), (*talker, "max_model_len")),
            f"the Talker (stage 1) runs {seqs} streams of up to {length} tokens, which needs"
            f" {needed} bytes ({_gib(needed)}) of KV cache, but it gets {kv_bytes}"
            f" ({_gib(kv_bytes)})",
            f"Set platforms.cuda.stages[stage_id=1].kv_cache_memory_bytes to at least {needed}"
            " or lower the Talker's max_num_seqs, because the Talker cannot be preempted when"
            " its KV cache is full.",
        )


def _gib(size: int) -> str:
    return f"{size / GIB:g} GiB"
