"""The operator's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "minicpm_speech_operator_reconciles_total",
    "Reconciles of MiniCPMSpeech resources, by result (ok, invalid, error).",
    ["result"],
)
FAILURES = Counter(
    "minicpm_speech_operator_reconcile_failures_total",
    "Reconciles that did not converge, by reason (InvalidSpec, ChildConflict, ApiError).",
    ["reason"],
)
DURATION = Histogram(
    "minicpm_speech_operator_reconcile_duration_seconds",
    "Wall time of one reconcile, API calls included.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RETRIES = Counter(
    "minicpm_speech_operator_reconcile_retries_total",
    "Reconciles tried again after a failure, by reason: transient (an API 5xx, 429 or "
    "timeout), race (an object deleted or changed meanwhile), other (retried on Kopf's "
    "backoff).",
    ["reason"],
)
CHILD_CHANGES = Counter(
    "minicpm_speech_operator_child_changes_total",
    "Child objects created or updated (spec changes and drift repairs), by kind and action.",
    ["kind", "action"],
)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address)
