"""The supervisor around a fake ``vllm serve`` (a real HTTP server) and a fake MPS daemon."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from .conftest import Pod, get, pid_alive


def _mps_pid(pod: Pod) -> int:
    text = pod.mps_log.read_text()
    return int(text.split("daemon started ")[1].split()[0])


def test_readiness_flips_only_after_warmup(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_HEALTH_DELAY="1.0", FAKE_CHAT_DELAY="0.3")
    seen = run.wait_ready()
    assert 503 in seen and seen[-1] == 200
    events = pod.events()
    chats = [e for e in events if e["event"] == "chat"]
    # Ready came after all three warm-up requests: the first with the default voice, then two
    # with their own reference voices, all asking for text and audio.
    assert len(chats) == 3
    assert [c["has_ref"] for c in chats] == [False, True, True]
    assert all(c["modalities"] == ["text", "audio"] and c["model"] == "minicpm-o" for c in chats)
    code, body = get(run.url("/livez"))
    assert code == 200, body
    # The MPS daemon runs with the percentage asked for, and the server got the run's env.
    log = pod.mps_log.read_text()
    assert "command set_default_active_thread_percentage 60" in log
    env = next(e for e in events if e["event"] == "start")["env"]
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(pod.root / "run" / "metrics")
    assert env["MINICPM_SPEECH_CONTROL_DIR"] == str(pod.root / "run" / "control")
    assert env["MINICPM_SPEECH_DEPLOY_CONFIG"].endswith("deploy-config.yaml")
    # expandable segments: a burst of cold voices must not make the allocator flush and retry
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    run.terminate()
    assert run.wait_exit() == 0


def test_sigterm_is_forwarded_and_mps_quits(pod: Pod, start: Any) -> None:
    run = start(pod.args())
    run.wait_ready()
    daemon = _mps_pid(pod)
    assert pid_alive(daemon)
    run.terminate(signal.SIGTERM)
    assert run.wait_exit() == 0
    signals = [e for e in pod.events() if e["event"] == "signal"]
    assert [s["signum"] for s in signals] == [signal.SIGTERM]
    log = pod.mps_log.read_text()
    assert log.index("command quit") > 0 and "daemon quit" in log
    assert not pid_alive(daemon)
    # Reaped as well: the supervisor adopts the forked daemon (child subreaper, or PID 1).
    assert not Path(f"/proc/{daemon}").exists()
    assert get(run.url("/readyz"))[0] == 0  # the health server is gone too


def test_sigint_is_forwarded_as_sigint(pod: Pod, start: Any) -> None:
    run = start(pod.args(mps=False, pct=None))
    run.wait_ready()
    run.terminate(signal.SIGINT)
    assert run.wait_exit() == 0
    assert [e["signum"] for e in pod.events() if e["event"] == "signal"] == [signal.SIGINT]


def test_exit_status_is_the_servers(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_TERM_STATUS="7")
    run.wait_ready()
    run.terminate()
    assert run.wait_exit() == 7
    assert "daemon quit" in pod.mps_log.read_text()


def test_server_ignoring_sigterm_is_killed_after_grace(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_IGNORE_TERM="1")
    run.wait_ready()
    began = time.monotonic()
    run.terminate()
    assert run.wait_exit() == 128 + signal.SIGKILL
    assert 2.5 < time.monotonic() - began < 20  # --grace-seconds 3
    assert "daemon quit" in pod.mps_log.read_text()


def test_server_crash_stops_mps_and_exits_non_zero(pod: Pod, start: Any) -> None:
    crash = pod.root / "crash-now"  # a crash once ready, however long the warm-up took
    run = start(pod.args(), FAKE_CRASH_ON=str(crash))
    run.wait_ready()
    daemon = _mps_pid(pod)
    crash.touch()
    rc = run.wait_exit()
    assert rc == 3, run.output()
    assert "server exited on its own with status 3" in run.output()
    assert "daemon quit" in pod.mps_log.read_text()
    assert not pid_alive(daemon)


def test_server_that_shuts_itself_down_cleanly_still_fails_the_pod(
    pod: Pod, start: Any
) -> None:
    """vLLM stops with status 0 when one of its engines dies: the pod must not look finished,
    and nothing the dead server's stage 2 wrote may still claim the plugin is serving."""
    crash = pod.root / "crash-now"
    args = pod.args(precapture=True, deploy=pod.deploy_config({"cfm_graph_precapture": True}))
    run = start(args, FAKE_PLUGIN="done", FAKE_CRASH_ON=str(crash), FAKE_CRASH_STATUS="0")
    run.wait_ready()
    control = pod.root / "run" / "control"
    assert (control / "plugin.json").is_file() and (control / "precapture.json").is_file()
    crash.touch()
    assert run.wait_exit() == 1, run.output()
    assert "server exited on its own with status 0" in run.output()
    assert not (control / "plugin.json").exists()
    assert not (control / "precapture.json").exists()


def test_a_server_that_stays_unhealthy_is_stopped_and_fails_the_pod(
    pod: Pod, start: Any
) -> None:
    """A dead stage leaves vLLM-Omni's API server up, answering 503 on /health: the pod turns
    unready at once, then stops the server and exits non-zero for Kubernetes to restart it."""
    sick = pod.root / "sick"
    args = pod.args(precapture=True, deploy=pod.deploy_config({"cfm_graph_precapture": True}))
    run = start(args, FAKE_PLUGIN="done", FAKE_UNHEALTHY_ON=str(sick))
    run.wait_ready()
    sick.touch()
    began = time.monotonic()
    while get(run.url("/readyz"))[0] == 200:
        assert time.monotonic() - began < 10, "still ready with /health failing"
        time.sleep(0.1)
    unready_after = time.monotonic() - began
    assert run.wait_exit() == 1, run.output()
    assert unready_after < 5 and time.monotonic() - began >= 10  # UNHEALTHY_FOR_S
    assert "server unhealthy: /health answered 503" in run.output()
    assert [e["signum"] for e in pod.events() if e["event"] == "signal"] == [signal.SIGTERM]
    assert not (pod.root / "run" / "control" / "plugin.json").exists()


def test_a_short_health_failure_only_takes_the_pod_out_of_rotation(
    pod: Pod, start: Any
) -> None:
    sick = pod.root / "sick"
    run = start(pod.args(mps=False, pct=None), FAKE_UNHEALTHY_ON=str(sick))
    run.wait_ready()
    sick.touch()
    seen = []
    began = time.monotonic()
    while 503 not in seen:
        assert time.monotonic() - began < 10
        seen.append(get(run.url("/readyz"))[0])
        time.sleep(0.1)
    sick.unlink()
    assert run.wait_ready()[-1] == 200
    assert run.proc.poll() is None
    run.terminate()
    assert run.wait_exit() == 0


def test_crash_before_ready_never_reports_ready(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_HEALTH_DELAY="30", FAKE_CRASH_AFTER="1.0")
    seen = []
    while run.proc.poll() is None:
        seen.append(get(run.url("/readyz"))[0])
        time.sleep(0.05)
    assert 200 not in seen
    assert run.proc.returncode == 3
    assert "daemon quit" in pod.mps_log.read_text()


def test_warmup_without_audio_fails_the_pod(pod: Pod, start: Any) -> None:
    run = start(pod.args(), FAKE_NO_AUDIO="1")
    rc = run.wait_exit()
    out = run.output()
    assert rc == 1, out
    assert "warm-up failed: warm-up response carries no audio" in out
    assert "daemon quit" in pod.mps_log.read_text()


def test_plugin_and_precapture_gate_readiness(pod: Pod, start: Any) -> None:
    args = pod.args(precapture=True, deploy=pod.deploy_config({"cfm_graph_precapture": True}))
    run = start(args, FAKE_PLUGIN="done", FAKE_PLUGIN_DELAY="2.0")
    seen = run.wait_ready()
    assert 503 in seen
    events = pod.events()
    plugin_at = next(e["t"] for e in events if e["event"] == "plugin")
    first_chat = min(e["t"] for e in events if e["event"] == "chat")
    assert plugin_at < first_chat  # the requests waited for the precapture
    run.terminate()
    assert run.wait_exit() == 0


def test_failed_precapture_fails_the_pod(pod: Pod, start: Any) -> None:
    args = pod.args(precapture=True, deploy=pod.deploy_config({"cfm_graph_precapture": True}))
    run = start(args, FAKE_PLUGIN="failed")
    assert run.wait_exit() == 1
    assert "graph precapture failed: fake failure" in run.output()
    assert not [e for e in pod.events() if e["event"] == "chat"]


def test_missing_plugin_fails_the_pod(pod: Pod, start: Any) -> None:
    deploy = pod.deploy_config({"batched_code2wav": True, "cfm_graph_precapture": False})
    # the timeout leaves the server's start room on a busy machine: the wait for plugin.json,
    # after /health answers, is the one that must run out
    run = start(pod.args(extra=("--warmup-timeout-seconds", "8"), deploy=deploy))
    assert run.wait_exit() == 1
    assert "stage 2 wrote no plugin.json" in run.output()


def test_plugin_off_needs_no_plugin_files(pod: Pod, start: Any) -> None:
    run = start(pod.args(deploy=pod.deploy_config({"batched_code2wav": False,
                                                   "cfm_graph_precapture": False})))
    run.wait_ready()
    run.terminate()
    assert run.wait_exit() == 0


def test_any_command_can_be_supervised(pod: Pod, start: Any) -> None:
    """A non-vLLM server command runs as given (how the GPU run drives a CUDA client)."""
    import sys

    server = str(Path(__file__).parent / "fake_server.py")
    run = start(pod.args(command=[sys.executable, server, "--port", str(pod.server_port)]))
    run.wait_ready()
    run.terminate()
    assert run.wait_exit() == 0
