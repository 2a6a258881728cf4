"""The serving pod's command line: ``minicpm-speech-runtime serve [options] -- COMMAND``.

The operator builds it (the serving pod and the perf Job's server arm) with
:meth:`SupervisorArgs.to_argv` and :func:`vllm_serve_argv`; the pod parses it back with
:func:`parse` and :func:`parse_server_command`. A bad line raises :class:`ArgsError`, whose
message the pod prints after ``bad arguments:``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NoReturn

from . import shutdown

EXECUTABLE = "minicpm-speech-runtime"
SUBCOMMAND = "serve"
DEFAULT_GRACE_SECONDS = shutdown.SERVER_GRACE_SECONDS
DEFAULT_DRAIN_SECONDS = shutdown.DRAIN_SECONDS
DEFAULT_WARMUP_REQUESTS = 3
DEFAULT_WARMUP_TIMEOUT_SECONDS = 1800.0


class ArgsError(ValueError):
    """The command line is malformed; ``str()`` says what, in one line."""


@dataclass(frozen=True, slots=True)
class SupervisorArgs:
    health_port: int
    server_port: int
    mps: bool
    precapture: bool
    mps_active_thread_percentage: int | None = None
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    warmup_requests: int = DEFAULT_WARMUP_REQUESTS
    warmup_timeout_seconds: float = DEFAULT_WARMUP_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        for name in ("health_port", "server_port"):
            port = getattr(self, name)
            if not 1 <= port <= 65535:
                raise ArgsError(f"--{name.replace('_', '-')} {port} is not a port")
        if self.health_port == self.server_port:
            raise ArgsError("--health-port equals --server-port")
        pct = self.mps_active_thread_percentage
        if pct is not None and not self.mps:
            raise ArgsError("--mps-active-thread-percentage needs --mps")
        if pct is not None and not 1 <= pct <= 100:
            raise ArgsError(f"--mps-active-thread-percentage {pct} not in 1..100")
        if self.grace_seconds < 0 or self.warmup_requests < 0 or self.warmup_timeout_seconds <= 0:
            raise ArgsError("negative grace, warm-up count or timeout")
        if self.drain_seconds < 0:
            raise ArgsError(f"--drain-seconds {self.drain_seconds:g} is negative")

    def termination_grace_seconds(self) -> int:
        """The pod's ``terminationGracePeriodSeconds`` for this drain bound and grace."""
        return shutdown.termination_grace_seconds(self.drain_seconds, self.grace_seconds)

    def to_argv(self) -> list[str]:
        """The options, without the executable, the subcommand or the server command; an
        option at its default is left out."""
        argv = ["--health-port", str(self.health_port), "--server-port", str(self.server_port)]
        argv.append("--mps" if self.mps else "--no-mps")
        if self.mps_active_thread_percentage is not None:
            argv += ["--mps-active-thread-percentage", str(self.mps_active_thread_percentage)]
        argv.append("--precapture" if self.precapture else "--no-precapture")
        for flag, value, default in (
            ("--grace-seconds", self.grace_seconds, DEFAULT_GRACE_SECONDS),
            ("--drain-seconds", self.drain_seconds, DEFAULT_DRAIN_SECONDS),
            ("--warmup-requests", self.warmup_requests, DEFAULT_WARMUP_REQUESTS),
            ("--warmup-timeout-seconds", self.warmup_timeout_seconds,
             DEFAULT_WARMUP_TIMEOUT_SECONDS),
        ):
            if value != default:
                argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return argv


def command_line(args: SupervisorArgs, server: Sequence[str]) -> list[str]:
    """The whole command: ``minicpm-speech-runtime serve OPTIONS -- SERVER...``."""
    return [EXECUTABLE, SUBCOMMAND, *args.to_argv(), "--", *server]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgsError(message)


def _parser() -> _Parser:
    p = _Parser(prog=f"{EXECUTABLE} {SUBCOMMAND}", add_help=False)
    p.add_argument("--health-port", type=int, required=True)
    p.add_argument("--server-port", type=int, required=True)
    mps = p.add_mutually_exclusive_group(required=True)
    mps.add_argument("--mps", dest="mps", action="store_true")
    mps.add_argument("--no-mps", dest="mps", action="store_false")
    p.add_argument("--mps-active-thread-percentage", type=int)
    pre = p.add_mutually_exclusive_group(required=True)
    pre.add_argument("--precapture", dest="precapture", action="store_true")
    pre.add_argument("--no-precapture", dest="precapture", action="store_false")
    p.add_argument("--grace-seconds", type=float, default=DEFAULT_GRACE_SECONDS)
    p.add_argument("--drain-seconds", type=float, default=DEFAULT_DRAIN_SECONDS)
    p.add_argument("--warmup-requests", type=int, default=DEFAULT_WARMUP_REQUESTS)
    p.add_argument("--warmup-timeout-seconds", type=float,
                   default=DEFAULT_WARMUP_TIMEOUT_SECONDS)
    return p


def parse(argv: Sequence[str]) -> tuple[SupervisorArgs, list[str]]:
    """``serve [options] -- COMMAND...`` (without the executable) as the options and the
    server command; raises :class:`ArgsError`."""
    args = list(argv)
    if not args or args[0] != SUBCOMMAND:
        raise ArgsError(f"expected '{SUBCOMMAND} [options] -- COMMAND'")
    if "--" not in args:
        raise ArgsError("no server command after '--'")
    cut = args.index("--")
    own, command = args[1:cut], args[cut + 1:]
    if not command:
        raise ArgsError("empty server command after '--'")
    ns = _parser().parse_args(own)
    return SupervisorArgs(
        health_port=ns.health_port,
        server_port=ns.server_port,
        mps=ns.mps,
        precapture=ns.precapture,
        mps_active_thread_percentage=ns.mps_active_thread_percentage,
        grace_seconds=ns.grace_seconds,
        drain_seconds=ns.drain_seconds,
        warmup_requests=ns.warmup_requests,
        warmup_timeout_seconds=ns.warmup_timeout_seconds,
    ), command


# --- the server command --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerCommand:
    """The command after ``--``; the fields are read only from ``vllm serve ... --omni``."""

    argv: tuple[str, ...]
    is_vllm: bool = False
    model: str | None = None
    deploy_config: str | None = None
    port: int | None = None
    served_model_name: str | None = None


# The runtime's ASGI middleware in the API server: it counts the requests in flight, which the
# supervisor's drain waits for, and refuses new ones once the drain began.
DRAIN_MIDDLEWARE = "minicpm_speech_runtime.serving.drain.DrainMiddleware"


def vllm_serve_argv(
    model: str, *, deploy_config: str, port: int, served_model_name: str,
    revision: str | None = None, host: str = "0.0.0.0",
) -> list[str]:
    """The server command the pod runs: vLLM-Omni's OpenAI server on all interfaces."""
    argv = ["vllm", "serve", model, "--omni", "--deploy-config", deploy_config,
            "--host", host, "--port", str(port), "--served-model-name", served_model_name,
            "--middleware", DRAIN_MIDDLEWARE]
    if revision:
        argv += ["--revision", revision]
    return argv


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ArgsError(f"server command option {name} has no value")
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def parse_server_command(argv: Sequence[str]) -> ServerCommand:
    """Recognise ``vllm serve MODEL ... --omni``; any other command runs as given."""
    argv = tuple(argv)
    if PurePosixPath(argv[0]).name != "vllm" or len(argv) < 2 or argv[1] != "serve":
        return ServerCommand(argv)
    if len(argv) < 3 or argv[2].startswith("-"):
        raise ArgsError("'vllm serve' without a model")
    if "--omni" not in argv:
        raise ArgsError("'vllm serve' without --omni")
    port_text = _option(argv, "--port")
    port = None
    if port_text is not None:
        try:
            port = int(port_text)
        except ValueError:
            raise ArgsError(f"server --port {port_text[:40]!r}") from None
    return ServerCommand(
        argv,
        is_vllm=True,
        model=argv[2],
        deploy_config=_option(argv, "--deploy-config") or None,
        port=port,
        served_model_name=_option(argv, "--served-model-name") or argv[2],
    )
