"""Leaving service without cutting a stream: the API server's side and the supervisor's.

The API server (``vllm serve``) runs :class:`DrainMiddleware`, named on its command line by
the contract (``--middleware``, :data:`minicpm_speech_contract.supervisor.DRAIN_MIDDLEWARE`).
It counts the requests in flight, from a ``POST`` (or a WebSocket session) reaching the server
to the last byte of its answer, in the multiprocess gauge ``requests_in_flight``. Once the
supervisor has written ``draining.json`` to the control directory (:mod:`.control`) it answers
every new one 503 with ``Retry-After``: the client tries again and the Service sends it to a
pod that stays. Reads (``/health``, ``/metrics``, ``/v1/models``) pass untouched.

The supervisor reads :func:`load` from the same metrics directory: the requests in flight and
the Code2Wav streams decoding or waiting for a slot. The drain is over when all three are 0.
A request is counted before the drain file is looked for, so a request the supervisor did not
count is one that finds the file and is refused.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minicpm_speech_contract.pod_metrics import ACTIVE_STREAMS, PREFIX, QUEUED_STREAMS

from .control import DRAIN_FILE, control_dir_from_env

IN_FLIGHT_REQUESTS = f"{PREFIX}_requests_in_flight"
# Another pod can take the request at once; the Service stops routing here within seconds.
RETRY_AFTER_SECONDS = 1
REFUSAL = "this server is shutting down and takes no new requests; retry"
# WebSocket close code 1013: try again later.
WS_TRY_AGAIN_LATER = 1013


class Gate:
    """One process's admission of requests: counted while they run, refused while draining."""

    def __init__(self, control_dir: Path | None, in_flight: Any) -> None:
        self.control_dir = control_dir
        self.in_flight = in_flight
        self.in_flight.set(0)  # the gauge's file shows the supervisor that requests are counted

    def draining(self) -> bool:
        return self.control_dir is not None and (self.control_dir / DRAIN_FILE).exists()

    def admit(self) -> bool:
        """Count a new request, unless the drain began; a True must be :meth:`release`\\ d."""
        self.in_flight.inc()
        if self.draining():
            self.in_flight.dec()
            return False
        return True

    def release(self) -> None:
        self.in_flight.dec()


_gate: Gate | None = None
_gate_lock = threading.Lock()


def process_gate() -> Gate:
    """This process's gate, created once (prometheus-client refuses a name twice)."""
    global _gate
    with _gate_lock:
        if _gate is None:
            from prometheus_client import CollectorRegistry, Gauge

            gauge = Gauge(IN_FLIGHT_REQUESTS, "Requests in the API server, arrival to last byte",
                          multiprocess_mode="livesum", registry=CollectorRegistry())
            _gate = Gate(control_dir_from_env(), gauge)
        return _gate


def refusal_body() -> bytes:
    """vLLM's error shape, so an OpenAI client reads the reason."""
    return json.dumps({"error": {"message": REFUSAL, "type": "ServiceUnavailable",
                                 "param": None, "code": 503}}).encode()


def refusal_headers() -> list[tuple[bytes, bytes]]:
    body = refusal_body()
    return [(b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            (b"connection", b"close")]


class DrainMiddleware:
    """ASGI middleware of the API server (Starlette builds it with the inner app)."""

    def __init__(self, app: Any, gate: Gate | None = None) -> None:
        self.app = app
        self.gate = gate or process_gate()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if not (kind == "websocket" or (kind == "http" and scope.get("method") == "POST")):
            await self.app(scope, receive, send)
            return
        if not self.gate.admit():
            await _refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.release()


async def _refuse(scope: dict[str, Any], send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 503,
                    "headers": refusal_headers()})
        await send({"type": "http.response.body", "body": refusal_body()})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 503,
                    "headers": refusal_headers()})
        await send({"type": "websocket.http.response.body", "body": refusal_body()})
    else:
        await send({"type": "websocket.close", "code": WS_TRY_AGAIN_LATER, "reason": REFUSAL})


@dataclass(frozen=True, slots=True)
class Load:
    """What a drain waits for; ``requests`` is None when no API server counts its requests."""

    requests: int | None
    active: int
    waiting: int

    @property
    def idle(self) -> bool:
        return self.requests == 0 and not self.active and not self.waiting

    def __str__(self) -> str:
        requests = "an unknown number of" if self.requests is None else str(self.requests)
        return (f"{requests} requests in flight, {self.active} Code2Wav streams decoding, "
                f"{self.waiting} waiting for a slot")


def load(metrics_dir: Path) -> Load:
    """The server processes' requests in flight and Code2Wav streams, from their metrics."""
    # Here, not at the top: the API server's middleware needs none of the runtime's metrics.
    from .metrics import multiprocess_registry

    registry = multiprocess_registry(metrics_dir)
    totals: dict[str, float] = {}
    if registry is not None:
        for family in registry.collect():
            for sample in family.samples:
                if sample.name in (IN_FLIGHT_REQUESTS, ACTIVE_STREAMS, QUEUED_STREAMS):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    requests = totals.get(IN_FLIGHT_REQUESTS)
    return Load(
        requests=None if requests is None else max(0, round(requests)),
        active=max(0, round(totals.get(ACTIVE_STREAMS, 0.0))),
        waiting=max(0, round(totals.get(QUEUED_STREAMS, 0.0))),
    )
