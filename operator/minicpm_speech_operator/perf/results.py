"""What a benchmark Job did, read off the Job and its pod: pure functions over plain dicts.

The result travels in the pod's termination message (schema v1 of the Job program), so the
Job needs no API rights. A message that is missing, malformed or about another hash is a
failed attempt with a reason, never a result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from minicpm_speech_contract.termination import TerminationMessageError, parse_termination_message

from ..manifests import CONFIG_HASH_KEY
from ..status import find_condition
from .jobs import ATTEMPT_KEY, CONTAINER, KINDS, PERF_KIND_KEY, Kind

JobState = Literal["active", "succeeded", "failed"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One Job as observed."""

    name: str
    uid: str
    kind: Kind
    config_hash: str
    attempt: int
    created: str
    state: JobState
    reason: str  # why Kubernetes failed it ("" otherwise)
    started: str | None
    finished: str | None


@dataclass(frozen=True, slots=True)
class Result:
    """What a finished attempt produced: the parsed message, or why there is none."""

    doc: Mapping[str, Any] | None
    reason: str  # CamelCase, "" when doc is a good result
    message: str


def attempt_of(job: Mapping[str, Any]) -> Attempt | None:
    """The Job as an Attempt; None for a Job whose labels are not the operator's."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    kind, attempt = labels.get(PERF_KIND_KEY), labels.get(ATTEMPT_KEY, "")
    if kind not in KINDS or not attempt.isdigit() or not labels.get(CONFIG_HASH_KEY):
        return None
    status = job.get("status") or {}
    state, reason = job_state(job)
    return Attempt(
        name=meta["name"], uid=meta.get("uid", ""), kind=kind, config_hash=labels[CONFIG_HASH_KEY],
        attempt=int(attempt), created=meta.get("creationTimestamp", ""), state=state,
        reason=reason, started=status.get("startTime"),
        finished=status.get("completionTime") or _condition_time(status, "Failed"),
    )


def job_state(job: Mapping[str, Any]) -> tuple[JobState, str]:
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "succeeded", ""
        if condition.get("type") == "Failed":
            return "failed", condition.get("reason") or "JobFailed"
    # Before the controller writes its condition, the counts already tell.
    limit = (job.get("spec") or {}).get("backoffLimit", 6)
    if status.get("succeeded", 0) >= 1:
        return "succeeded", ""
    if status.get("failed", 0) > limit:
        return "failed", "BackoffLimitExceeded"
    return "active", ""


def _condition_time(status: Mapping[str, Any], kind: str) -> str | None:
    condition = find_condition(status, kind)
    time: str | None = condition.get("lastTransitionTime") if condition.get(
        "status") == "True" else None
    return time


def newest_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    if not pods:
        return None
    return max(pods, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp", ""),
                                    (p.get("metadata") or {}).get("name", "")))


def pod_evidence(pod: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """(termination message of the perf container or None, the pod's own failure reason)."""
    if pod is None:
        return None, "NoPod"
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        if container.get("name") != CONTAINER:
            continue
        for where in ("state", "lastState"):
            terminated = (container.get(where) or {}).get("terminated")
            if terminated is not None:
                return terminated.get("message") or None, status.get("reason") or ""
    return None, status.get("reason") or ""


def read_result(attempt: Attempt, pod: Mapping[str, Any] | None) -> Result:
    """Judge a finished attempt by its pod's termination message."""
    text, pod_reason = pod_evidence(pod)
    if pod_reason == "Evicted":
        return Result(None, "Evicted", f"the pod of Job {attempt.name} was evicted")
    if attempt.reason == "DeadlineExceeded":
        return Result(None, "DeadlineExceeded",
                      f"Job {attempt.name} ran past spec.perf.job.activeDeadlineSeconds")
    if text is None:
        why = "failed" if attempt.state == "failed" else "finished"
        return Result(None, "NoResult" if attempt.state == "succeeded" else "JobFailed",
                      f"Job {attempt.name} {why} without a termination message"
                      + (f" ({attempt.reason})" if attempt.reason else ""))
    try:
        doc = parse_termination_message(text)
    except TerminationMessageError as error:
        return Result(None, "MalformedResult", f"Job {attempt.name}: {error}")
    if doc["kind"] != attempt.kind or doc["hash"] != attempt.config_hash:
        return Result(None, "MalformedResult",
                      f"Job {attempt.name} reported a {doc['kind']} of hash {doc['hash']}, "
                      f"not a {attempt.kind} of {attempt.config_hash}")
    if doc["status"] != "ok":
        return Result(None, "RunFailed", f"Job {attempt.name}: {doc['reason']}")
    if attempt.state == "failed":
        return Result(None, attempt.reason or "JobFailed",
                      f"Job {attempt.name} failed ({attempt.reason}) after reporting a result")
    return Result(doc, "", "")


FINAL = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class KindState:
    """Where one kind (sweep or wer) of the current hash stands, and what to start next."""

    kind: Kind
    state: Literal["Waiting", "Running", "Retrying", "Succeeded", "Failed"]
    attempt: int  # of the newest Job, 0 before the first
    job: str | None
    reason: str
    message: str
    started: str | None = None
    finished: str | None = None
    doc: Mapping[str, Any] | None = None
    next_attempt: int | None = None  # the attempt to create now, if any

    @property
    def final(self) -> bool:
        return self.state in FINAL


def kind_state(kind: Kind, attempts: Sequence[Attempt], results: Mapping[str, Result],
               max_attempts: int) -> KindState:
    """Judge the newest attempt of ``kind``; a failed one is retried up to max_attempts."""
    runs = sorted((a for a in attempts if a.kind == kind), key=lambda a: a.attempt)
    if not runs:
        return KindState(kind, "Waiting", 0, None, "NotStarted", "not started yet",
                         next_attempt=1)
    last = runs[-1]
    if last.state == "active":
        return KindState(kind, "Running", last.attempt, last.name, "Running",
                         f"Job {last.name} is running (attempt {last.attempt}/{max_attempts})",
                         started=last.started)
    result = results.get(last.name) or Result(None, "NoResult", f"Job {last.name}: not read")
    if result.doc is not None:
        return KindState(kind, "Succeeded", last.attempt, last.name, "Measured",
                         f"Job {last.name} reported its result", last.started, last.finished,
                         doc=result.doc)
    if last.attempt < max_attempts:
        return KindState(kind, "Retrying", last.attempt, last.name, result.reason,
                         f"attempt {last.attempt}/{max_attempts} failed: {result.message}",
                         last.started, last.finished, next_attempt=last.attempt + 1)
    return KindState(kind, "Failed", last.attempt, last.name, result.reason,
                     f"attempt {last.attempt}/{max_attempts} failed, no retries left: "
                     f"{result.message}", last.started, last.finished)


def to_read(attempts: Sequence[Attempt], config_hash: str) -> list[Attempt]:
    """The finished newest attempt of each kind of this hash: whose pod holds a result."""
    newest: dict[str, Attempt] = {}
    for a in attempts:
        if a.config_hash != config_hash:
            continue
        if a.kind not in newest or a.attempt > newest[a.kind].attempt:
            newest[a.kind] = a
    return [a for a in newest.values() if a.state != "active"]
