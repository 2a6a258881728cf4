"""``minicpm-speech-runtime serve``: the serving pod's entry point.

    minicpm-speech-runtime serve --health-port 9400 --server-port 8091 \\
        (--mps --mps-active-thread-percentage N | --no-mps) (--precapture | --no-precapture) \\
        -- vllm serve MODEL --omni --deploy-config FILE --port 8091 ...

In order: every check of :mod:`.config` (a failure prints one line and exits 2 for bad
arguments, 1 otherwise, with nothing started); the health server; the MPS control daemon
(``--mps``); the server command as a child in its own process group, with
``PROMETHEUS_MULTIPROC_DIR``, ``MINICPM_SPEECH_CONTROL_DIR``,
``MINICPM_SPEECH_DEPLOY_CONFIG`` and the CUDA allocator's settings
(:mod:`minicpm_speech_contract.allocator`) set; the warm-up (:mod:`.warmup`), after which
``/readyz`` answers 200; from then on the server's ``/health`` is checked, and a server that stays
unhealthy (a dead stage) is stopped.

SIGTERM/SIGINT, once the pod has been ready, first drain it (:mod:`.drain`): ``/readyz``
answers 503 ``draining`` at once, so the Service stops routing here; ``draining.json`` in the
control directory makes the API server refuse new requests with 503 and ``Retry-After``; the
supervisor waits until no request is in flight and no Code2Wav stream decodes or waits, for at
most ``--drain-seconds``. A second signal, or the deadline, ends the drain early, and the log
says what it left. Then the signal goes to the server's process group; after
``--grace-seconds`` the group is killed. Whatever ends the server, the MPS daemon is sent
``quit`` and waited for. The pod's termination grace period covers all of it
(:mod:`minicpm_speech_contract.shutdown`).

The exit status is the server's (128 + signal when a signal ended it), and never 0 unless a
signal asked for the stop: 1 when the warm-up failed or the server stayed unhealthy while it
still ran, or when it exited on its own with 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from minicpm_speech_contract.allocator import with_allocator_conf

from . import control, drain
from .config import StartupError, SupervisorConfig, parse_args, validate
from .health import HealthServer, HealthState
from .mps import MpsDaemon, MpsError, become_subreaper, reap_adopted_orphans
from .warmup import WarmupError, http_status, run_requests, wait_for_health, wait_for_plugin

log = logging.getLogger("minicpm_speech_runtime.serve")
PROG = "minicpm-speech-runtime"

# Once ready, the server's own /health is what says that one of its stages died: vLLM-Omni
# keeps the API server up and answers 503 there. The pod turns unready at the first failed
# check and fails (so that Kubernetes restarts it) once /health has failed for this long, at
# least this many checks in a row; a slow answer under load is not a failure until then.
HEALTH_POLL_S = 2.0
HEALTH_TIMEOUT_S = 10.0
UNHEALTHY_FOR_S = 10.0
UNHEALTHY_CHECKS = 3
# How often a drain looks at what is left: reading the server's metric files is cheap.
DRAIN_POLL_S = 0.25
DRAINED = "drained"


def _fail(reason: str, code: int) -> int:
    print(f"{PROG}: {reason}", file=sys.stderr, flush=True)
    return code


class Supervisor:
    def __init__(self, config: SupervisorConfig, run_dir: Path | None = None) -> None:
        self.config = config
        self.run_dir = run_dir or control.default_run_dir()
        self.state = HealthState()
        self.stop_event = threading.Event()
        self.stop_signal: int | None = None
        self.hurry = threading.Event()  # a second signal: stop draining
        self.served = False  # ready once: clients may have streams here
        # The warm-up and health threads change readiness only while no stop has begun, and
        # a drain's "draining" is never overwritten by an answer that came a moment late.
        self._readiness = threading.Lock()
        self.warmup_error: str | None = None
        self.unhealthy: str | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.mps: MpsDaemon | None = None
        self.health: HealthServer | None = None
        self.started_at = time.monotonic()

    # ----------------------------------------------------------------- probes

    def live(self) -> tuple[bool, str]:
        server = self.server
        if server is not None and server.poll() is not None:
            return False, f"server exited with {server.returncode}"
        if self.mps is not None and self.mps.started and not self.mps.alive():
            return False, "MPS control daemon is gone"
        return True, "alive" if server is not None else "starting"

    # ----------------------------------------------------------------- run

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        else:
            self.hurry.set()
        self.stop_event.set()

    def child_env(self, control_dir: Path, metrics_dir: Path) -> dict[str, str]:
        env = with_allocator_conf(os.environ)
        env[control.MULTIPROC_ENV] = str(metrics_dir)
        env[control.CONTROL_DIR_ENV] = str(control_dir)
        if self.config.server.deploy_config is not None:
            env[control.DEPLOY_CONFIG_ENV] = str(self.config.server.deploy_config)
        return env

    def run(self) -> int:
        cfg = self.config
        control_dir, metrics_dir = control.prepare_run_dir(self.run_dir)
        self.state.multiproc_dir = str(metrics_dir)
        self.state.live_check = self.live
        try:
            self.health = HealthServer(self.state, cfg.health_port)
        except OSError as exc:
            return _fail(f"cannot serve the health port {cfg.health_port}: {exc.strerror}", 1)
        self.health.start()
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            return self._run(control_dir, metrics_dir)
        finally:
            self.state.set_ready(False, "stopped")
            self._stop_mps()
            self.health.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, control_dir: Path, metrics_dir: Path) -> int:
        cfg = self.config
        if cfg.mps:
            become_subreaper()
            pipe, log_dir = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"]), Path(
                os.environ["CUDA_MPS_LOG_DIRECTORY"]
            )
            exe = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
            self.mps = MpsDaemon(exe, pipe, log_dir, cfg.mps_active_thread_percentage)
            try:
                self.mps.start()
            except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
                return _fail(f"MPS: {exc}", 1)
            self.state.metrics.mps_up.set(1)
            if self.stop_event.is_set():
                return 128 + (self.stop_signal or signal.SIGTERM)
        try:
            self.server = subprocess.Popen(
                list(cfg.server.argv),
                env=self.child_env(control_dir, metrics_dir),
                start_new_session=True,
            )
        except OSError as exc:
            return _fail(f"cannot start {cfg.server.argv[0]}: {exc.strerror}", 1)
        self.state.metrics.server_up.set(1)
        self.state.set_ready(False, "warming up")
        log.info("server started (pid %d): %s", self.server.pid, " ".join(cfg.server.argv))
        warm = threading.Thread(target=self._warmup, args=(control_dir,), daemon=True)
        warm.start()
        return self._supervise(control_dir, metrics_dir)

    def _supervise(self, control_dir: Path, metrics_dir: Path) -> int:
        assert self.server is not None
        server, grace = self.server, self.config.grace_seconds
        mps_checked = time.monotonic()
        while server.poll() is None:
            if self.stop_event.wait(0.2):
                break
            if self.mps is not None and time.monotonic() - mps_checked > 5.0:
                mps_checked = time.monotonic()
                self.state.metrics.mps_up.set(1 if self.mps.alive() else 0)
        with self._readiness:
            served = self.served
        if self.stop_signal is not None and served and server.poll() is None:
            self._drain(control_dir, metrics_dir)
        self.state.set_ready(False, "stopping")
        if server.poll() is None:
            sig = self.stop_signal or signal.SIGTERM
            log.info("forwarding signal %d to the server's process group", sig)
            self._signal_group(sig)
            try:
                server.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("server outlived the %g s grace period; killing it", grace)
                self._signal_group(signal.SIGKILL)
                server.wait()
        # Whatever the server left in its group goes with it.
        self._signal_group(signal.SIGKILL)
        self.state.metrics.server_up.set(0)
        # What the stage-2 process wrote described a server that is gone: nothing may read it
        # as current (a restarted container shares this emptyDir until its supervisor starts).
        control.withdraw(self.run_dir / "control")
        rc = server.returncode
        status = 128 - rc if rc < 0 else rc
        if self.warmup_error is not None and self.stop_signal is None:
            print(f"{PROG}: warm-up failed: {self.warmup_error}", file=sys.stderr, flush=True)
            return status or 1
        if self.unhealthy is not None and self.stop_signal is None:
            print(f"{PROG}: {self.unhealthy}", file=sys.stderr, flush=True)
            return status or 1
        if self.stop_signal is None:
            # Nobody asked it to stop: the pod must fail so that Kubernetes restarts it, even
            # when the server shut itself down cleanly (as vLLM does when an engine dies).
            print(f"{PROG}: server exited on its own with status {status}", file=sys.stderr,
                  flush=True)
            return status or 1
        if status:
            print(f"{PROG}: server exited with status {status}", file=sys.stderr, flush=True)
        return status

    def _set_ready(self, ready: bool, phase: str) -> bool:
        """Readiness from the warm-up or the health watch; False once a stop has begun."""
        with self._readiness:
            if self.stop_event.is_set():
                return False
            self.state.set_ready(ready, phase)
            return True

    def _drain(self, control_dir: Path, metrics_dir: Path) -> None:
        """Take no new streams and wait for those in flight, within ``--drain-seconds``."""
        began, bound = time.monotonic(), self.config.drain_seconds
        # The file first: once /readyz says draining, every new request is already refused.
        # In the other order a request arriving between the two was taken, seen on a loaded
        # machine (four threads on two cores).
        control.write_json(control_dir, control.DRAIN_FILE,
                           {"since": time.time(), "deadline_seconds": bound})
        with self._readiness:
            self.state.set_ready(False, "draining")
        self.state.metrics.draining.set(1)
        left = drain.load(metrics_dir)
        log.info("draining: new requests are refused; waiting up to %g s for %s", bound, left)
        while (why := self._drain_ends(left, began)) is None:
            self.hurry.wait(DRAIN_POLL_S)
            left = drain.load(metrics_dir)
        took = time.monotonic() - began
        if why == DRAINED:
            log.info("drained in %.1f s", took)
        elif left.requests is None:
            log.warning("draining: the server does not count its requests (its command lacks "
                        "the drain middleware); stopping it with %s", left)
        else:
            log.warning("drain ended by %s after %.1f s, leaving %s", why, took, left)
            self.state.metrics.drain_abandoned.set(
                max(left.requests, left.active + left.waiting))
        self.state.metrics.draining.set(0)

    def _drain_ends(self, left: drain.Load, began: float) -> str | None:
        """Why the drain ends now, or None while it waits on."""
        assert self.server is not None
        if left.idle:
            return DRAINED
        if left.requests is None:
            return "an uncounted server"
        if self.server.poll() is not None:
            return "the server's exit"
        if self.hurry.is_set():
            return "a second signal"
        if time.monotonic() - began >= self.config.drain_seconds:
            return "its deadline"
        return None

    def _signal_group(self, sig: int) -> None:
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server.pid, sig)

    def _stop_mps(self) -> None:
        if self.mps is not None and self.mps.started:
            self.mps.stop()
            self.state.metrics.mps_up.set(0)
            # The server has been waited for already: what is left are adopted orphans.
            reap_adopted_orphans()

    def _warmup(self, control_dir: Path) -> None:
        cfg = self.config
        base = f"http://127.0.0.1:{cfg.server_port}"
        deadline = self.started_at + cfg.warmup_timeout_seconds

        def keep_going() -> bool:
            return not self.stop_event.is_set() and (
                self.server is not None and self.server.poll() is None
            )

        try:
            wait_for_health(base, deadline, keep_going)
            if cfg.batched_code2wav:
                self.state.set_ready(False, "waiting for the stage-2 plugin")
                wait_for_plugin(control_dir, cfg.precapture, deadline, keep_going)
            self.state.set_ready(False, "warm-up requests")
            model = cfg.server.served_model_name or "default"

            def count(ok: bool) -> None:
                self.state.metrics.warmup_requests.labels("ok" if ok else "error").inc()

            run_requests(base, model, cfg.warmup_requests, timeout=300.0, on_result=count)
        except WarmupError as exc:
            if not keep_going():
                return
            self.warmup_error = str(exc)
            self.stop_event.set()
            return
        self.state.metrics.warmup_seconds.set(time.monotonic() - self.started_at)
        with self._readiness:
            self.served = True
        if not self._set_ready(True, "ready"):
            return
        log.info("ready after %.1f s", time.monotonic() - self.started_at)
        self._watch_health(f"{base}/health", keep_going)

    def _watch_health(self, url: str, keep_going: Callable[[], bool]) -> None:
        failing_since: float | None = None
        failures = 0
        while not self.stop_event.wait(HEALTH_POLL_S) and keep_going():
            code = http_status(url, timeout=HEALTH_TIMEOUT_S)
            if code == 200:
                if failing_since is not None and self._set_ready(True, "ready"):
                    log.info("server /health answers 200 again")
                failing_since, failures = None, 0
                continue
            answer = f"answered {code}" if code else "did not answer"
            if failing_since is None:
                failing_since = time.monotonic()
                log.warning("server /health %s: not ready", answer)
            failures += 1
            self._set_ready(False, f"server /health {answer}")
            if failures >= UNHEALTHY_CHECKS and time.monotonic() - failing_since >= UNHEALTHY_FOR_S:
                if not keep_going():
                    return
                self.unhealthy = (f"server unhealthy: /health {answer}, failing for "
                                  f"{time.monotonic() - failing_since:.0f} s")
                self.stop_event.set()
                return


OPTIONS = """
options of serve (before the --):
  --health-port PORT                 /readyz, /livez and /metrics (required)
  --server-port PORT                 the port the server command listens on (required)
  --mps | --no-mps                   start NVIDIA MPS before the server (one is required)
  --mps-active-thread-percentage N   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the daemon
  --precapture | --no-precapture     capture every CUDA graph in the warm-up (one is required)
  --drain-seconds S                  after SIGTERM, how long the pod waits for its streams
  --grace-seconds S                  then how long the server may take to stop
  --warmup-requests N                requests the warm-up sends
  --warmup-timeout-seconds S         how long the warm-up may take
  -h, --help                         show this help and exit
"""


def _wants_help(argv: Sequence[str]) -> bool:
    """``-h``/``--help`` among the supervisor's own arguments (never the server command's)."""
    own = argv[: list(argv).index("--")] if "--" in argv else argv
    return any(arg in ("-h", "--help") for arg in own)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if _wants_help(args):
        print(f"usage: {PROG} serve [options] -- COMMAND...\n\n{__doc__}{OPTIONS}", end="")
        return 0
    logging.basicConfig(
        level=os.environ.get("MINICPM_SPEECH_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = validate(parse_args(args))
    except StartupError as exc:
        return _fail(str(exc), exc.code)
    return Supervisor(config).run()


if __name__ == "__main__":
    sys.exit(main())
