"""Scale-down drains: a pod leaving service finishes its streams and takes no new ones.

The supervisor runs as a process around the fake server, whose POSTs pass the runtime's own
drain gate (what :class:`DrainMiddleware` does inside ``vllm serve``); the middleware itself is
driven here as an ASGI app."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from minicpm_speech_runtime.serving import control, drain

from .conftest import Pod, Running, get


def _post(port: int, body: dict[str, Any], timeout: float = 60.0) -> tuple[int, dict[str, str],
                                                                            bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (OSError, http.client.HTTPException) as exc:
        return 0, {}, repr(exc).encode()
    finally:
        conn.close()


def _streams(pod: Pod, n: int) -> tuple[list[threading.Thread], dict[int, tuple[int, bytes]]]:
    """``n`` streams started on the server; returns once the server has begun each."""
    results: dict[int, tuple[int, bytes]] = {}

    def one(i: int) -> None:
        code, _, body = _post(pod.server_port, {"id": i, "stream": True})
        results[i] = (code, body)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    _wait_for(lambda: len(_events(pod, "stream_start")) == n, "the streams to start")
    return threads, results


def _events(pod: Pod, kind: str) -> list[dict[str, Any]]:
    return [e for e in pod.events() if e["event"] == kind]


def _wait_for(check: Any, what: str, timeout: float = 20.0) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, f"waited {timeout} s for {what}"
        time.sleep(0.02)
    return time.monotonic() - began


def _readyz(run: Running) -> tuple[int, str]:
    code, body = get(run.url("/readyz"))
    return code, body.decode().strip()


def test_sigterm_with_live_streams_refuses_new_ones_and_finishes_them(
    pod: Pod, start: Any
) -> None:
    run = start(pod.args(extra=("--drain-seconds", "60")), FAKE_STREAM_CHUNKS="12",
                FAKE_STREAM_INTERVAL="0.25")
    run.wait_ready()
    threads, results = _streams(pod, 3)
    began = time.monotonic()
    run.terminate(signal.SIGTERM)
    # Out of the Service at once, and a new stream is told to go elsewhere.
    _wait_for(lambda: _readyz(run) == (503, "draining"), "/readyz draining", timeout=1.5)
    code, headers, body = _post(pod.server_port, {"id": "late", "stream": True})
    assert code == 503 and headers["retry-after"] == "1", (code, headers, body)
    assert "shutting down" in json.loads(body)["error"]["message"]
    code, metrics = get(run.url("/metrics"))
    assert b"minicpm_speech_draining 1.0" in metrics
    assert b"minicpm_speech_requests_in_flight 3.0" in metrics
    for t in threads:
        t.join(timeout=30)
    # Every live stream ran to its end, and only then was the server told to stop.
    for i in range(3):
        code, body = results[i]
        assert code == 200 and body.count(b'"chunk"') == 12 and body.endswith(b"[DONE]\n\n"), (
            i, code, body[-200:])
    assert run.wait_exit() == 0, run.output()
    ends = [e["t"] for e in _events(pod, "stream_end")]
    sigterm = [e["t"] for e in _events(pod, "signal")]
    assert len(ends) == 3 and len(sigterm) == 1 and max(ends) <= sigterm[0]
    assert 2.0 < time.monotonic() - began < 30
    assert [e["id"] for e in _events(pod, "refused")] == ["late"]
    assert "drained in" in run.output()
    # The next start must not find itself draining.
    assert not (pod.root / "run" / "control" / control.DRAIN_FILE).exists()


def test_a_drain_that_hits_its_deadline_stops_the_server_and_says_what_it_left(
    pod: Pod, start: Any
) -> None:
    run = start(pod.args(extra=("--drain-seconds", "1.5")), FAKE_STREAM_CHUNKS="200",
                FAKE_STREAM_INTERVAL="0.1")
    run.wait_ready()
    threads, results = _streams(pod, 2)
    began = time.monotonic()
    run.terminate(signal.SIGTERM)
    assert run.wait_exit() == 0
    assert 1.5 <= time.monotonic() - began < 12
    out = run.output()
    assert "drain ended by its deadline" in out
    assert "leaving 2 requests in flight" in out
    for t in threads:
        t.join(timeout=10)
    assert all(not body.endswith(b"[DONE]\n\n") for _, body in results.values())
    assert not _events(pod, "stream_end")


def test_a_second_signal_ends_the_drain(pod: Pod, start: Any) -> None:
    run = start(pod.args(mps=False, pct=None, extra=("--drain-seconds", "120")),
                FAKE_STREAM_CHUNKS="400", FAKE_STREAM_INTERVAL="0.1")
    run.wait_ready()
    _streams(pod, 1)
    run.terminate(signal.SIGTERM)
    _wait_for(lambda: _readyz(run)[1] == "draining", "the drain")
    time.sleep(0.5)
    assert run.proc.poll() is None  # still draining
    run.terminate(signal.SIGTERM)
    assert run.wait_exit(timeout=15) == 0
    out = run.output()
    assert "drain ended by a second signal" in out and "leaving 1 requests in flight" in out


def test_a_pod_stopped_before_it_was_ready_does_not_drain(pod: Pod, start: Any) -> None:
    run = start(pod.args(extra=("--drain-seconds", "120")), FAKE_HEALTH_DELAY="30")
    _wait_for(lambda: _events(pod, "start") and _readyz(run) == (503, "warming up"),
              "the server's start")
    run.terminate()
    assert run.wait_exit(timeout=15) == 0
    assert "draining" not in run.output()


def test_a_server_that_counts_no_requests_is_stopped_at_once(pod: Pod, start: Any) -> None:
    run = start(pod.args(mps=False, pct=None, extra=("--drain-seconds", "120")),
                FAKE_NO_DRAIN_GATE="1")
    run.wait_ready()
    began = time.monotonic()
    run.terminate()
    assert run.wait_exit(timeout=20) == 0
    assert time.monotonic() - began < 10
    assert "the server does not count its requests" in run.output()


# ------------------------------------------------------------------ the middleware


class _Gauge:
    def __init__(self) -> None:
        self.value = 0.0
        self.peak = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def inc(self) -> None:
        self.value += 1
        self.peak = max(self.peak, self.value)

    def dec(self) -> None:
        self.value -= 1


def _call(mw: drain.DrainMiddleware, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent


def _middleware(tmp_path: Path) -> tuple[drain.DrainMiddleware, _Gauge, list[str]]:
    gauge, served = _Gauge(), []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        served.append(scope.get("path", ""))
        assert gauge.value == (1 if scope["type"] == "websocket"
                               or scope.get("method") == "POST" else 0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return drain.DrainMiddleware(app, drain.Gate(tmp_path, gauge)), gauge, served


def test_the_middleware_counts_a_request_until_its_last_byte(tmp_path: Path) -> None:
    mw, gauge, served = _middleware(tmp_path)
    sent = _call(mw, {"type": "http", "method": "POST", "path": "/v1/chat/completions"})
    assert sent[0]["status"] == 200 and served == ["/v1/chat/completions"]
    assert gauge.peak == 1 and gauge.value == 0


def test_the_middleware_refuses_new_requests_once_draining_and_lets_reads_through(
    tmp_path: Path,
) -> None:
    mw, gauge, served = _middleware(tmp_path)
    control.write_json(tmp_path, control.DRAIN_FILE, {"since": 0})
    sent = _call(mw, {"type": "http", "method": "POST", "path": "/v1/chat/completions"})
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == 503
    assert served == [] and gauge.value == 0
    assert _call(mw, {"type": "http", "method": "GET", "path": "/health"})[0]["status"] == 200
    ws = _call(mw, {"type": "websocket", "path": "/v1/realtime"})
    assert ws == [{"type": "websocket.close", "code": drain.WS_TRY_AGAIN_LATER,
                   "reason": drain.REFUSAL}]
    assert served == ["/health"]


def test_load_reads_what_the_server_processes_wrote(tmp_path: Path) -> None:
    uncounted = drain.load(tmp_path)
    assert uncounted == drain.Load(requests=None, active=0, waiting=0) and not uncounted.idle
    script = (
        "from minicpm_speech_runtime.serving import drain\n"
        "from minicpm_speech_runtime.serving.metrics import runtime_metrics\n"
        "gate = drain.process_gate()\n"
        "assert gate.admit() and gate.admit() and gate.admit()\n"
        "gate.release()\n"
        "runtime_metrics().set_active_streams(1)\n"
        "runtime_metrics().set_waiting_streams(3)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   env={**os.environ, control.MULTIPROC_ENV: str(tmp_path)})
    left = drain.load(tmp_path)
    assert left == drain.Load(requests=2, active=1, waiting=3) and not left.idle
    assert str(left) == ("2 requests in flight, 1 Code2Wav streams decoding, "
                         "3 waiting for a slot")
    assert drain.Load(requests=0, active=0, waiting=0).idle
