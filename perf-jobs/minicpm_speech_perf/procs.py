"""Starting, waiting for and stopping the server and client processes.

The orchestrators only talk to the `ProcessRunner` protocol, so tests swap in a fake server
and a fake client while the real subprocess, readiness and signal logic stays under test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class ProcessError(RuntimeError):
    """A server or client process did not behave: named, with where its log is."""


class ServerHandle(Protocol):
    def poll(self) -> int | None: ...

    def stop(self, grace_s: float) -> int: ...


class ProcessRunner(Protocol):
    def start_server(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> ServerHandle: ...

    def run_client(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, timeout_s: float
    ) -> int: ...


@dataclass(slots=True)
class PopenServer:
    """A server in its own process group so SIGTERM reaches its worker processes too."""

    proc: subprocess.Popen[bytes]

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace_s: float) -> int:
        return stop_process_group(self.proc, grace_s)


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM the group, wait `grace_s`, then SIGKILL; returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    _signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone: nothing to stop
        os.killpg(proc.pid, sig)


def _spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """In its own process group, so a stop reaches everything it started."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


class SubprocessRunner:
    """The real runner: output goes to per-process log files in the artifacts dir."""

    def start_server(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> ServerHandle:
        return PopenServer(_spawn(argv, env, log_path))

    def run_client(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, timeout_s: float
    ) -> int:
        proc = _spawn(argv, env, log_path)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process_group(proc, grace_s=5.0)
            raise ProcessError(
                f"client exceeded {timeout_s:g} s and was stopped (log: {log_path})"
            ) from None
        except BaseException:
            # The Job itself is being stopped: leave no client behind to load the server.
            stop_process_group(proc, grace_s=5.0)
            raise


def wait_ready(
    url: str,
    *,
    timeout_s: float,
    server: ServerHandle | None = None,
    poll_s: float = 1.0,
    log_path: Path | None = None,
) -> float:
    """Poll `url` until it answers 200; fail early when the server process dies.

    Returns the seconds waited. A vLLM server answers /health only after every stage has
    loaded and warmed its graphs, so this is the moment the first request can be timed.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    where = f" (log: {log_path})" if log_path else ""
    while True:
        if server is not None and (code := server.poll()) is not None:
            raise ProcessError(f"server exited with code {code} before it was ready{where}")
        if answers_ok(url, timeout_s=min(5.0, max(poll_s, 0.5))):
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            raise ProcessError(f"server not ready at {url} after {timeout_s:g} s{where}")
        time.sleep(poll_s)


def answers_ok(url: str, *, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
