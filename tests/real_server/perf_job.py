"""The perf Jobs as the operator renders them, run on this machine (real-server lane).

A Job's program config comes from the operator's own ``program_config`` for the lane's
manifest; only what a CPU machine must have differs: paths point here (model folder, deploy
config, Seed-TTS folder, Whisper folder, artifacts), a live Job reaches the lane's pod rather
than a Service, and the config's ``requests`` makes the counts small, since one request takes
seconds of CPU. The program runs as the Job runs it (``perf-jobs ...``), and the operator's
``read_result`` judges the termination message it leaves.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .conftest import cpu_env, free_port, render

PERF = {"concurrencies": [1, 2], "headlineConcurrency": 2, "gate": {"concurrencies": [1]}}


@dataclass
class JobRun:
    config: dict[str, Any]
    returncode: int
    output: str
    message: str
    seconds: float

    @property
    def artifacts(self) -> Path:
        return Path(self.config["artifacts_dir"])

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted((self.artifacts / "logs").glob("*.log")))


def job_config(kind: str, model_dir: Path, seed_tts: Path, work: Path,
               counts: dict[str, int], **local: str) -> dict[str, Any]:
    """The operator's program config for a ``kind`` Job ("sweep" or "wer") of the lane's
    manifest, pointed at this machine. ``local`` may give ``base_url`` (a live Job: the pod
    to measure) and ``whisper_model`` (the WER run's evaluator)."""
    from minicpm_speech_operator.manifests import owner_of
    from minicpm_speech_operator.perf.jobs import (
        CANDIDATE_FILE,
        CONFIG_DIR,
        Arm,
        JobRequest,
        job_name,
        program_config,
    )

    live = "base_url" in local
    rendered = render(free_port(), free_port(), {**PERF, "placement": "live"} if live else PERF)
    cfg = rendered.cfg
    owner = owner_of(rendered.body)
    config = program_config(owner, JobRequest(kind, 1, Arm(rendered.spec, cfg)),  # type: ignore[arg-type]
                            job_name(owner, kind, cfg.config_hash, 1))  # type: ignore[arg-type]
    deploy = work / CANDIDATE_FILE
    rendered.write_cpu_deploy_config(deploy)
    for arm in config["arms"]:
        if "command" in arm:  # a live Job's arm starts no server
            arm["command"] = rendered.localized(arm["command"], model_dir,
                                                f"{CONFIG_DIR}/{CANDIDATE_FILE}", deploy)
    config["client"] |= {"tokenizer": str(model_dir), "dataset_root": str(seed_tts),
                         "run_timeout_s": 900}
    if live:
        config["client"]["base_url"] = local["base_url"]
    if "whisper_model" in local:
        config["asr"]["whisper_model"] = local["whisper_model"]
    config["server"]["ready_timeout_s"] = 900
    config |= {"artifacts_dir": str(work / "artifacts"),
               "termination_log": str(work / "termination-log"), "requests": counts}
    return config


def run_job(argv: list[str], config: dict[str, Any], work: Path) -> JobRun:
    """``perf-jobs ARGV --config FILE`` under the pod's CPU environment."""
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = cpu_env(work / "run", (config["arms"][0].get("env") or {}))
    began = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "perf-jobs"), *argv,
                           "--config", str(path)], env=env, capture_output=True, text=True,
                          timeout=1500)  # fmt: skip
    log = Path(config["termination_log"])
    message = log.read_text() if log.is_file() else ""
    return JobRun(config, done.returncode, done.stdout + done.stderr, message,
                  time.monotonic() - began)


def judge(run: JobRun, kind: str) -> Any:
    """The operator's verdict on the finished Job, from its pod's termination message."""
    from minicpm_speech_operator.perf.results import CONTAINER, Attempt, read_result

    attempt = Attempt(name="lane", uid="lane", kind=kind,  # type: ignore[arg-type]
                      config_hash=run.config["config_hash"], attempt=1, created="",
                      state="succeeded" if run.returncode == 0 else "failed", reason="",
                      started=None, finished=None)  # fmt: skip
    terminated = {"exitCode": run.returncode, "message": run.message}
    pod = {"status": {"containerStatuses": [{"name": CONTAINER,
                                             "state": {"terminated": terminated}}]}}
    return read_result(attempt, pod)
