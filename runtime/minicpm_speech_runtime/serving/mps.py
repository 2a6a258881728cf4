"""The MPS control daemon's lifecycle: start, answer, thread percentage, quit, gone.

``nvidia-cuda-mps-control -d`` forks the daemon and returns. Commands are sent by running
``nvidia-cuda-mps-control`` with the command on stdin; it exits non-zero when no daemon
answers on ``$CUDA_MPS_PIPE_DIRECTORY``. The daemon is considered up when such a command
answers; its pid, when it can be found (``nvidia-cuda-mps-control.pid`` in the pipe directory,
else a ``nvidia-cuda-mps-control -d`` process in ``/proc`` with our pipe directory), is used to
wait until it is really gone after ``quit`` (and to kill it if it outlives the wait).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from minicpm_speech_contract.shutdown import MPS_QUIT_SECONDS

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"


class MpsError(Exception):
    pass


def become_subreaper() -> bool:
    """Adopt orphaned descendants (the daemon ``-d`` forks off), so they can be reaped here.

    In the pod the supervisor is PID 1 and adopts them anyway; elsewhere they would go to an
    init that may never reap them (the GPU run saw such a zombie).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_adopted_orphans() -> None:
    """Collect every exited process this subreaper adopted.

    ``nvidia-cuda-mps-control -d`` forks twice; the middle process exits at once and, its
    parent gone, is adopted here. Nothing else waits for it, so without this it would
    outlive the supervisor as a zombie (seen on the GPU machine).
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _pid_alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    if state == "Z":
        # It exited after the first look: collect it now, or it stays a zombie in the pod.
        _reap(pid)
        return False
    return True


class MpsDaemon:
    def __init__(
        self,
        exe: str,
        pipe_dir: Path,
        log_dir: Path,
        active_thread_percentage: int | None = None,
        start_timeout: float = 30.0,
        quit_timeout: float = MPS_QUIT_SECONDS,
    ) -> None:
        self.exe = exe
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self.percentage = active_thread_percentage
        self.start_timeout, self.quit_timeout = start_timeout, quit_timeout
        self.pid: int | None = None
        self.started = False
        self._alive_cache: tuple[float, bool] = (0.0, False)
        self._lock = threading.Lock()

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def command(self, text: str, timeout: float = 10.0) -> tuple[int, str]:
        """Send one control command; (exit status, output)."""
        try:
            out = subprocess.run(
                [self.exe],
                input=text + "\n",
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, "timed out"
        return out.returncode, (out.stdout + out.stderr).strip()

    def answers(self) -> bool:
        rc, _ = self.command("get_default_active_thread_percentage", timeout=5.0)
        return rc == 0

    def start(self) -> None:
        """Start the daemon and wait until its control pipe answers; raises :class:`MpsError`."""
        out = subprocess.run(
            [self.exe, "-d"], capture_output=True, text=True, env=self.env, check=False,
            timeout=self.start_timeout,
        )
        if out.returncode != 0:
            why = (out.stderr or out.stdout).strip().splitlines()
            raise MpsError(
                f"nvidia-cuda-mps-control -d failed ({out.returncode}): {why[0] if why else ''}"
            )
        self.started = True
        deadline = time.monotonic() + self.start_timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise MpsError(f"MPS control daemon did not answer in {self.start_timeout:g} s")
            time.sleep(0.2)
        self.pid = self._find_pid()
        if self.percentage is not None:
            rc, text = self.command(f"set_default_active_thread_percentage {self.percentage}")
            if rc != 0:
                raise MpsError(f"set_default_active_thread_percentage failed: {text}")
        log.info("MPS control daemon up (pid %s, pipe %s)", self.pid, self.pipe_dir)

    def _find_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.pipe_dir / PID_FILE).read_text().split()[0])
        # Else: the control daemon process started with our pipe directory in its environment.
        wanted = f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                if not cmdline[0].endswith(b"nvidia-cuda-mps-control") or b"-d" not in cmdline:
                    continue
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
        return None

    def alive(self, max_age: float = 5.0) -> bool:
        """Whether the daemon lives; answers cached for ``max_age`` seconds."""
        if not self.started:
            return False
        if self.pid is not None:
            return _pid_alive(self.pid)
        with self._lock:
            when, value = self._alive_cache
            if time.monotonic() - when > max_age:
                value = self.answers()
                self._alive_cache = (time.monotonic(), value)
            return value

    def stop(self) -> bool:
        """Send ``quit`` and wait until the daemon is gone; True when it went by itself."""
        if not self.started:
            return True
        rc, text = self.command("quit")
        if rc != 0:
            log.warning("MPS quit answered %s: %s", rc, text)
        deadline = time.monotonic() + self.quit_timeout
        clean = True
        while self._still_there():
            if time.monotonic() > deadline:
                clean = False
                if self.pid is not None:
                    log.warning("MPS control daemon %s outlived quit; killing it", self.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    time.sleep(0.5)
                break
            time.sleep(0.1)
        self.started = False
        log.info("MPS control daemon stopped (%s)", "clean" if clean else "killed")
        return clean

    def _still_there(self) -> bool:
        if self.pid is not None:
            return _pid_alive(self.pid)
        return self.answers()
