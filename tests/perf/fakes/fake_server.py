"""A stand-in for `vllm serve`: a real HTTP server on loopback with a slow start.

It answers /health with 503 until `--ready-after` seconds have passed, then 200, and records
its life (start, ready, SIGTERM, exit) as JSON lines in `--events` so tests can prove order,
readiness and a clean stop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--die-after", type=float, default=None)
    args = p.parse_args()

    def event(kind: str) -> None:
        with open(args.events, "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {
                        "who": "server",
                        "name": args.name,
                        "event": kind,
                        "t": time.time(),
                        "pid": os.getpid(),
                    }
                )
                + "\n"
            )

    started = time.monotonic()
    announced = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ready = time.monotonic() - started >= args.ready_after
            if ready and not announced.is_set():
                announced.set()
                event("ready")
            self.send_response(200 if ready and self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)

    def on_term(signum: int, frame: object) -> None:
        event("sigterm")
        if not args.ignore_sigterm:
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    event("start")
    if args.die_after is not None:

        def die() -> None:
            time.sleep(args.die_after)
            event("crash")
            os._exit(7)

        threading.Thread(target=die, daemon=True).start()
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    event("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
