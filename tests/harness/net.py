"""Loopback ports and plain HTTP GETs for tests that start servers as processes."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); 0 and no body when nothing answers in time, the body included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        try:
            return int(exc.code), exc.read()
        except OSError:
            return 0, b""
    except (urllib.error.URLError, OSError):
        return 0, b""
