"""The perf Jobs' program against the pod's real command, and a pod losing its server.

The sweep is the Job's own: ``perf-jobs sweep`` with the config file the operator renders for a
sweep Job (``program_config``), its paths pointed at this machine, and the official client
``vllm bench serve --omni`` sending the protocol's request body over a Seed-TTS-format folder.
Only the request counts are smaller, through the config's ``requests`` key: on a CPU one
request takes seconds. Its termination message is judged by the operator's ``read_result``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from .conftest import skip_outside_lane, start_pod, stream_and_kill
from .perf_job import job_config, judge, run_job

skip_outside_lane()

pytestmark = pytest.mark.timeout(1800)

COUNTS = {"measured": 2, "warmup": 2, "repeats": 1}


def test_the_sweep_runs_the_official_client_against_the_pods_command(
    model_dir: Path, seed_tts: Path, tmp_path: Path
) -> None:
    config = job_config("sweep", model_dir, seed_tts, tmp_path, COUNTS)
    run = run_job(["sweep"], config, tmp_path)
    print(f"\nsweep: {run.seconds:.0f} s, exit {run.returncode}\n{run.output[-2000:]}")
    assert run.returncode == 0, f"{run.output[-3000:]}\n{run.logs()}"
    result = judge(run, "sweep")
    assert result.reason == "", result.message
    points = result.doc["points"]
    assert [(p["arm"], p["c"]) for p in points] == [("B", 1), ("B", 2)]
    for point in points:
        assert point["ok"] == point["n"] == COUNTS["measured"] * COUNTS["repeats"]
        assert point["tput"] > 0 and point["ttfp_ms"] > 0
    manifest_doc = json.loads((run.artifacts / "manifest.json").read_text())
    assert manifest_doc["requests"] == {**COUNTS, "protocol": False}
    (visit,) = manifest_doc["visits"]
    assert visit["ready_after_s"] > 0 and visit["server_exit_code"] in (0, 128 + signal.SIGTERM)
    argv = visit["runs"][0]["argv"]
    assert argv[:4] == ["vllm", "bench", "serve", "--omni"]
    body = json.loads(argv[argv.index("--extra-body") + 1])
    assert body["sampling_params_list"][1]["max_tokens"] == 2048  # the protocol's, unchanged


def test_a_killed_server_mid_stream_fails_the_pod(model_dir: Path, tmp_path: Path) -> None:
    """``vllm serve`` itself killed during a streamed reply: the client's stream breaks off
    (no ``[DONE]``), not a hang; the supervisor exits non-zero, and the stage-2 records it
    leaves claim nothing."""
    pod = start_pod(model_dir, tmp_path)
    try:
        pod.wait_ready()
        lines, error, after = stream_and_kill(pod.base, pod.server_pid())
        print(f"\nclient: {type(error).__name__ if error else 'end of stream'} {after:.1f} s "
              f"after the kill")
        assert after < 60, "the client waited on a dead server"
        assert error is not None or not any(b"[DONE]" in line for line in lines)
        rc = pod.process.wait(timeout=120)
    finally:
        pod.stop()
    assert rc == 128 + signal.SIGKILL, pod.log_tail()
    assert "server exited on its own with status 137" in pod.log_tail()
    assert sorted(p.name for p in pod.control.glob("*.json")) == []
