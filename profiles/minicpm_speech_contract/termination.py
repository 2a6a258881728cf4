"""The compact result a perf Job leaves in its pod's termination message.

Kubernetes keeps at most 4096 bytes of `/dev/termination-log`, and the operator reads the
result from there so the Job needs no API rights. The Job writes it with `encode`; the
operator reads it with `parse_termination_message`.

Schema, version 1 (a single JSON object, UTF-8, always under 4096 bytes):

    v          int     1
    kind       str     "sweep" | "wer"
    status     str     "ok" | "failed"
    hash       str     the serving-config hash the Job was started for (echoed back)
    mode       str     "dedicated" | "maintenance" | "live"
    started    str     UTC start, "YYYY-MM-DDTHH:MM:SSZ"
    finished   str     UTC finish, same format
    reason     str     why it failed ("" when ok), at most 300 characters
    truncated  bool    true when optional fields were dropped to stay under the limit
    baseline   str|null  sweep only: the baseline arm (A of ABBA), null for a single arm
    points     list    sweep only: one entry per arm and concurrency, ascending C
        arm          str    arm name
        c            int    max concurrency
        tput         float|null  mean audio throughput, audio-seconds per wall-second
        ttfp_ms      float|null  mean time to first audio (request-weighted)
        ttfp_p95_ms  float|null  mean of the measured runs' p95 time to first audio
        ok, n        int    successful and total requests over the measured runs
      optional (dropped first when space runs out):
        tput_min, tput_max  float|null  min and max over the measured runs
        rtf          float|null  mean completion real-time factor
        rps          float|null  mean request throughput, requests per second
        mem_mib      float|null  peak GPU memory from NVML; null when NVML was unavailable
    wer        list    wer only: one entry per quality concurrency, C8 first
        c            int    max concurrency
        wer          float|null  official evaluator's mean per-request WER (fraction, 0.05 = 5 %)
        done, judged, n  int  completed, WER-judged and total requests
        sim, sim_p10 float|null  speaker similarity of the output to its reference voice: mean
                     and 10th percentile of the per-utterance cosines, -1 to 1
        mos, mos_p10 float|null  predicted naturalness (MOS, 1 to 5): mean and 10th percentile
        sim_n, mos_n int    utterances behind each figure
      optional (dropped first when space runs out):
        rescored     float|null  independent re-scorer's mean WER
        rescored_judged int     requests the re-scorer judged
    sim_model  str     wer only: the speaker model behind `sim` (name-version), e.g.
                       "resemblyzer-0.1.4"; figures of two models are never compared
    mos_model  str     wer only: the naturalness model behind `mos`, likewise

A quality result without `sim`/`mos` still parses (an older Job), and the operator's gate
then fails it, naming the missing figure: a figure that was never measured must not pass.

Unknown keys are ignored by the parser so a later minor addition does not break an older
operator; a change of meaning bumps `v`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

VERSION = 1
MAX_BYTES = 4096
# Headroom below the kubelet's limit: the message must never be cut mid-JSON.
BUDGET_BYTES = 4000
MAX_REASON = 300
KINDS = ("sweep", "wer")
STATUSES = ("ok", "failed")
MODES = ("dedicated", "maintenance", "live")

POINT_REQUIRED = ("arm", "c", "tput", "ttfp_ms", "ttfp_p95_ms", "ok", "n")
POINT_OPTIONAL = ("tput_min", "tput_max", "rtf", "rps", "mem_mib")
WER_REQUIRED = ("c", "wer", "done", "judged", "n")
# Kept when the optional detail goes: the gate reads them.
WER_QUALITY = ("sim", "sim_p10", "mos", "mos_p10", "sim_n", "mos_n")
WER_OPTIONAL = ("rescored", "rescored_judged")
QUALITY_MODEL_KEYS = ("sim_model", "mos_model")

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_HASH = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ARM = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,15}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:/-]{0,63}$")
_INT_KEYS = {"c", "ok", "n", "done", "judged", "rescored_judged", "sim_n", "mos_n"}
_COSINES = {"sim", "sim_p10"}


class TerminationMessageError(ValueError):
    """A termination message that is missing, too long, or not in schema version 1."""


def round_sig(value: float | None, digits: int = 4) -> float | None:
    """Round to significant digits: enough for gates, few bytes in the message."""
    if value is None or not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")


def encode(doc: dict[str, Any]) -> str:
    """Serialise a message, dropping optional detail until it fits the budget.

    Order of sacrifice: optional per-entry fields, then all entries. The status, hash and
    times always survive, so the operator can still tell what happened.
    """
    doc = dict(doc, reason=str(doc.get("reason", ""))[:MAX_REASON], truncated=False)
    text = _dump(doc)
    if _fits(text):
        return text
    for key, optional in (("points", POINT_OPTIONAL), ("wer", WER_OPTIONAL)):
        if key in doc:
            doc[key] = [{k: v for k, v in e.items() if k not in optional} for e in doc[key]]
    doc["truncated"] = True
    text = _dump(doc)
    if _fits(text):
        return text
    for key in ("points", "wer"):
        if key in doc:
            doc[key] = []
    text = _dump(doc)
    if not _fits(text):
        raise TerminationMessageError("message does not fit even without entries")
    return text


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _fits(text: str) -> bool:
    return len(text.encode("utf-8")) <= BUDGET_BYTES


def parse_termination_message(text: str) -> dict[str, Any]:
    """Validate a termination message and return it as a dict; raise TerminationMessageError."""
    if not isinstance(text, str) or not text.strip():
        raise TerminationMessageError("termination message is empty")
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise TerminationMessageError(f"termination message exceeds {MAX_BYTES} bytes")
    try:
        doc = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as exc:
        raise TerminationMessageError(f"termination message is not JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise TerminationMessageError("termination message is not a JSON object")
    if doc.get("v") != VERSION:
        raise TerminationMessageError(f"v: expected {VERSION}, got {doc.get('v')!r}")
    _check_header(doc)
    if doc["kind"] == "sweep":
        _check_entries(doc, "points", POINT_REQUIRED, POINT_OPTIONAL)
        baseline = doc.get("baseline")
        if baseline is not None and not (isinstance(baseline, str) and _ARM.match(baseline)):
            raise TerminationMessageError("baseline: expected an arm name or null")
    else:
        _check_entries(doc, "wer", WER_REQUIRED, (*WER_QUALITY, *WER_OPTIONAL))
        for key in QUALITY_MODEL_KEYS:
            if key in doc and not (isinstance(doc[key], str) and _MODEL.match(doc[key])):
                raise TerminationMessageError(f"{key}: expected a model name, got "
                                              f"{str(doc[key])[:80]!r}")
    return doc


def _not_a_number(token: str) -> Any:
    # Python reads NaN and Infinity, which JSON has not: a NaN figure would pass every
    # comparison of the checks below and of the gate.
    raise TerminationMessageError(f"termination message holds {token}, which is not JSON")


def _check_header(doc: dict[str, Any]) -> None:
    checks: dict[str, tuple[Any, ...] | re.Pattern[str]] = {
        "kind": KINDS,
        "status": STATUSES,
        "mode": MODES,
        "hash": _HASH,
        "started": _TIME,
        "finished": _TIME,
    }
    for key, rule in checks.items():
        value = doc.get(key)
        ok = (
            isinstance(value, str) and bool(rule.match(value))
            if isinstance(rule, re.Pattern)
            else value in rule
        )
        if not ok:
            raise TerminationMessageError(f"{key}: invalid value {value!r}")
    if not isinstance(doc.get("reason"), str) or len(doc["reason"]) > MAX_REASON:
        raise TerminationMessageError("reason: expected a string of at most 300 characters")
    if not isinstance(doc.get("truncated"), bool):
        raise TerminationMessageError("truncated: expected a boolean")
    if doc["status"] == "failed" and not doc["reason"]:
        raise TerminationMessageError("reason: required when status is 'failed'")


def _check_entries(
    doc: dict[str, Any], key: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    entries = doc.get(key)
    if not isinstance(entries, list):
        raise TerminationMessageError(f"{key}: expected a list")
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            raise TerminationMessageError(f"{where}: expected an object")
        for name in required:
            if name not in entry:
                raise TerminationMessageError(f"{where}.{name}: missing")
        for name in (*required, *optional):
            if name in entry:
                _check_value(f"{where}.{name}", name, entry[name])


def _check_value(where: str, name: str, value: Any) -> None:
    if name == "arm":
        if not (isinstance(value, str) and _ARM.match(value)):
            raise TerminationMessageError(f"{where}: expected an arm name")
    elif name in _INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TerminationMessageError(f"{where}: expected a non-negative integer")
    elif name in _COSINES:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not -1.0 <= value <= 1.0):
            raise TerminationMessageError(f"{where}: expected a cosine from -1 to 1, or null")
    elif value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or value < 0
    ):
        raise TerminationMessageError(f"{where}: expected a non-negative number or null")
