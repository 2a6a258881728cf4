"""A tiny real HTTP server standing in for ``vllm serve ... --omni``.

It answers ``GET /health`` (after ``FAKE_HEALTH_DELAY`` seconds) and
``POST /v1/chat/completions`` (after ``FAKE_CHAT_DELAY``; with audio unless
``FAKE_NO_AUDIO``), logs one JSON line per event to ``FAKE_SERVER_LOG``, and on SIGTERM exits
with ``FAKE_TERM_STATUS`` (or ignores it with ``FAKE_IGNORE_TERM``). ``FAKE_CRASH_AFTER``
makes it exit 3 that many seconds after it started answering, ``FAKE_CRASH_ON`` as soon as
that file exists (``FAKE_CRASH_STATUS`` sets the status); while ``FAKE_UNHEALTHY_ON`` exists
``/health`` answers 503, as vLLM-Omni's does once a stage died. ``FAKE_PLUGIN`` writes the
stage-2 plugin's control files (``FAKE_PLUGIN=failed`` a failed precapture) after
``FAKE_PLUGIN_DELAY``; ``FAKE_METRICS`` records runtime metrics in multiprocess mode;
``FAKE_CUDA`` runs a torch matmul on the GPU at start and per request.

A chat request with ``"stream": true`` is answered as server-sent events:
``FAKE_STREAM_CHUNKS`` chunks (default 5), one every ``FAKE_STREAM_INTERVAL`` seconds (default
0.2), then ``data: [DONE]``. Every POST passes the runtime's own drain gate
(:mod:`minicpm_speech_runtime.serving.drain`, what its middleware does in ``vllm serve``):
counted while it runs, refused with 503 once the supervisor drains; ``FAKE_NO_DRAIN_GATE``
leaves it out, as a server command without the middleware would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOG = os.environ.get("FAKE_SERVER_LOG")
START = time.monotonic()


def event(kind: str, **fields: object) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"event": kind, "t": time.monotonic() - START, **fields}) + "\n")


def cuda_work() -> float:
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    b = (a @ a).sum().item()
    torch.cuda.synchronize()
    return float(b)


_gate: object = None


def drain_gate() -> object:
    global _gate
    if _gate is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
        from minicpm_speech_runtime.serving import drain

        _gate = drain.process_gate()
    return _gate


class _NoGauge:
    def set(self, value: float) -> None:
        pass

    def inc(self) -> None:
        pass

    def dec(self) -> None:
        pass


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            ok = time.monotonic() - START >= float(os.environ.get("FAKE_HEALTH_DELAY", "0"))
            sick = os.environ.get("FAKE_UNHEALTHY_ON")
            ok = ok and not (sick and os.path.exists(sick))
            self._send(200 if ok else 503, {"ok": ok})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        from minicpm_speech_runtime.serving import drain

        ungated = drain.Gate(None, _NoGauge())
        gate = ungated if os.environ.get("FAKE_NO_DRAIN_GATE") else drain_gate()
        assert isinstance(gate, drain.Gate)
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        if not gate.admit():
            event("refused", id=body.get("id"))
            self.send_response(503)
            for name, value in drain.refusal_headers():
                self.send_header(name.decode(), value.decode())
            self.end_headers()
            self.wfile.write(drain.refusal_body())
            return
        try:
            if body.get("stream"):
                self._stream(body)
            else:
                self._chat(body)
        finally:
            gate.release()

    def _stream(self, body: dict[str, object]) -> None:
        event("stream_start", id=body.get("id"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(int(os.environ.get("FAKE_STREAM_CHUNKS", "5"))):
            self.wfile.write(f"data: {json.dumps({'chunk': i})}\n\n".encode())
            self.wfile.flush()
            time.sleep(float(os.environ.get("FAKE_STREAM_INTERVAL", "0.2")))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        event("stream_end", id=body.get("id"))

    def _chat(self, body: dict[str, object]) -> None:
        time.sleep(float(os.environ.get("FAKE_CHAT_DELAY", "0")))
        if os.environ.get("FAKE_CUDA"):
            cuda_work()
        event("chat", modalities=body.get("modalities"), has_ref="ref_audio" in body,
              model=body.get("model"))
        audio = None if os.environ.get("FAKE_NO_AUDIO") else {"id": "a", "data": "UklGRg=="}
        self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                               "content": "ok",
                                                               "audio": audio}}]})

    def _send(self, code: int, doc: object) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def write_plugin_files() -> None:
    time.sleep(float(os.environ.get("FAKE_PLUGIN_DELAY", "0")))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
    from minicpm_speech_runtime.serving import control

    directory = control.control_dir_from_env()
    assert directory is not None
    state = "failed" if os.environ["FAKE_PLUGIN"] == "failed" else "done"
    # logged before the files exist, so no request the files let through can be logged first
    event("plugin", state=state)
    control.write_json(directory, control.PLUGIN_FILE, {"pid": os.getpid(), "options": {}})
    control.write_json(directory, control.PRECAPTURE_FILE,
                       {"state": state, "reason": "fake failure", "graphs": 3})


def record_metrics() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
    from minicpm_speech_runtime.serving.metrics import runtime_metrics

    m = runtime_metrics()
    m.record_prep_counters({"ahead": 3, "cached": 1, "late": 1, "inline": 2, "queue_full": 0,
                            "failed": 0, "abandoned": 1, "inline_runs": 3})
    m.record_setups(1, 4, batched=True, copied=2)
    m.forwards.inc(3)
    m.engine_steps.labels("forward").inc(3)
    m.engine_steps.labels("final_window").inc()
    m.set_waiting_streams(1)
    m.observe_slot_wait(0.2)
    m.graph_event("capture", "decode", 5)
    m.graph_event("replay", "decode", 40)
    m.graph_event("refusal", "setup")
    m.graph_event("eager", "decode", 2)
    m.set_graph_budget(5, 32)
    m.observe_chunk(0.012, first=True)
    m.observe_chunk(0.004, first=False)
    m.set_active_streams(4)
    m.observe_first_audio(0.09)
    m.set_real_time_margin(1.25)
    m.set_gpu_memory(1 << 30, 2 << 30, {"num_ooms": 0, "num_alloc_retries": 2})
    event("metrics")


def main() -> None:
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8091
    recorded = ("MINICPM_SPEECH", "PROMETHEUS", "CUDA_MPS", "PYTORCH")
    event("start", argv=argv, env={k: v for k, v in os.environ.items() if k.startswith(recorded)})

    def on_term(signum: int, frame: object) -> None:
        event("signal", signum=signum)
        if os.environ.get("FAKE_IGNORE_TERM"):
            return
        os._exit(int(os.environ.get("FAKE_TERM_STATUS", "0")))

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if os.environ.get("FAKE_CUDA"):
        event("cuda", value=cuda_work())
    if os.environ.get("FAKE_METRICS"):
        record_metrics()
    if os.environ.get("FAKE_PLUGIN"):
        threading.Thread(target=write_plugin_files, daemon=True).start()
    crash_after, crash_on = os.environ.get("FAKE_CRASH_AFTER"), os.environ.get("FAKE_CRASH_ON")
    if crash_after or crash_on:
        began = time.monotonic()

        def due() -> bool:
            if crash_on and os.path.exists(crash_on):
                return True
            return bool(crash_after) and time.monotonic() - began >= float(crash_after or 0)

        def later() -> None:
            while not due():
                time.sleep(0.02)
            event("crash")
            os._exit(int(os.environ.get("FAKE_CRASH_STATUS", "3")))

        threading.Thread(target=later, daemon=True).start()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    httpd.serve_forever()


if __name__ == "__main__":
    main()
