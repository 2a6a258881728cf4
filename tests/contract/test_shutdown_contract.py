"""The pod's shutdown bounds: one owner for each number, and a command line that carries them."""

from __future__ import annotations

import pytest
from minicpm_speech_contract import shutdown, supervisor


def _args(**kw: float) -> supervisor.SupervisorArgs:
    return supervisor.SupervisorArgs(health_port=9400, server_port=8091, mps=False,
                                     precapture=False, **kw)  # type: ignore[arg-type]


def test_the_default_drain_outlasts_the_longest_stream_at_real_time() -> None:
    audio = shutdown.longest_stream_audio_seconds()
    assert audio == pytest.approx(163.84)
    assert audio / shutdown.SLOWEST_DRAIN_REAL_TIME_MARGIN <= shutdown.DRAIN_SECONDS


def test_the_grace_period_is_every_step_plus_a_margin() -> None:
    args = _args(drain_seconds=100.5, grace_seconds=10)
    assert args.termination_grace_seconds() == 100.5 + 10 + shutdown.PRESTOP_SECONDS \
        + shutdown.MPS_QUIT_SECONDS + shutdown.MARGIN_SECONDS + 0.5


def test_the_drain_bound_travels_on_the_command_line() -> None:
    assert "--drain-seconds" not in _args().to_argv()  # the default is left out
    args = _args(drain_seconds=82)
    argv = args.to_argv()
    assert argv[argv.index("--drain-seconds") + 1] == "82"
    parsed, _ = supervisor.parse(["serve", *argv, "--", "server"])
    assert parsed == args


def test_a_negative_drain_is_refused() -> None:
    with pytest.raises(supervisor.ArgsError, match="--drain-seconds -1 is negative"):
        supervisor.parse(["serve", *_args().to_argv(), "--drain-seconds", "-1", "--", "x"])
