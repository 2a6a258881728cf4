"""The health port answers each probe in one piece, so a probe with a short timeout never
reads headers whose body is still waiting for the CPU."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from minicpm_speech_runtime.serving.health import HealthServer, HealthState


@pytest.mark.parametrize("path, status", [("/readyz", 503), ("/livez", 200), ("/metrics", 200)])
def test_each_answer_leaves_in_one_write(
    monkeypatch: pytest.MonkeyPatch, path: str, status: int
) -> None:
    writes: list[bytes] = []

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def write(sock: socket.socket, data: bytes, *args: object) -> Any:
            if threading.current_thread().name != "MainThread":  # the server's side only
                writes.append(bytes(data))
            return real(sock, data, *args)
        return write

    for name in ("send", "sendall"):  # a buffered writer sends, an unbuffered one sendalls
        monkeypatch.setattr(socket.socket, name, counting(getattr(socket.socket, name)))
    server = HealthServer(HealthState(), port=0, host="127.0.0.1")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
            client.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            reply = b""
            while chunk := client.recv(1 << 16):
                reply += chunk
    finally:
        server.stop()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.0 {status}".encode()) and body
    assert len(writes) == 1 and writes[0] == reply
