"""``/livez``, ``/readyz`` and ``/metrics`` on the health port, from the standard library.

The server runs on its own thread from the moment the supervisor's checks passed, so the
startup probe gets an answer (503) while the model loads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import SupervisorMetrics, multiprocess_registry


class HealthState:
    """What the probes read; every field is set by the supervisor."""

    def __init__(self, metrics: SupervisorMetrics | None = None) -> None:
        self.metrics = metrics or SupervisorMetrics()
        self._lock = threading.Lock()
        self.ready = False
        self.phase = "starting"
        self.live_check: Callable[[], tuple[bool, str]] = lambda: (True, "starting")
        self.multiproc_dir: str | None = None

    def set_ready(self, ready: bool, phase: str) -> None:
        with self._lock:
            self.ready, self.phase = ready, phase
        self.metrics.ready.set(1 if ready else 0)

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            return self.ready, self.phase

    def metrics_text(self) -> bytes:
        parts = [generate_latest(self.metrics.registry)]
        registry = multiprocess_registry(self.multiproc_dir) if self.multiproc_dir else None
        if registry is not None:
            parts.append(generate_latest(registry))
        return b"".join(parts)


def _handler(state: HealthState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Buffered, so the status line, headers and body leave in one write when the handler
        # returns: a probe never holds headers while the body waits behind a busy CPU.
        wbufsize = 1 << 16

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/livez":
                ok, why = state.live_check()
                self._send(200 if ok else 503, why)
            elif path == "/readyz":
                ok, why = state.readiness()
                self._send(200 if ok else 503, why)
            elif path == "/metrics":
                try:
                    body = state.metrics_text()
                except Exception as exc:  # a torn value file must not kill the endpoint
                    self._send(500, f"metrics: {exc}")
                    return
                self._send(200, body, CONTENT_TYPE_LATEST)
            else:
                self._send(404, "not found")

        def _send(self, code: int, body: str | bytes, ctype: str = "text/plain") -> None:
            data = body if isinstance(body, bytes) else (body + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # probes are not news
            pass

    return Handler


class HealthServer:
    def __init__(self, state: HealthState, port: int, host: str = "0.0.0.0") -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(state))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
