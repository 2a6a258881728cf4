"""Fixtures of the real-server lane (``make test-real-server``): the serving pod's own command,
as the operator renders it for a ``MiniCPMSpeech``, run on this machine's CPU against a tiny
random MiniCPM-o 4.5 folder.

The pod's container command and arguments (the supervisor, then ``vllm serve ... --omni``) and
its deploy config come from the operator's own builders (``serving_config``,
``build_deployment``); the lane changes only what a CPU machine must: the model folder and the
deploy-config file are local paths, and the deploy config gets the CPU overlay of
:mod:`.deploy_config`. Nothing here imports vLLM until a fixture runs, so the main suite, which
lacks it, collects only the skips of the test modules.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.net import free_port, http_get

LANE_ENV = "MINICPM_SPEECH_REAL_SERVER_LANE"
IN_LANE = os.environ.get(LANE_ENV) == "1"
SERVED_MODEL = "minicpmo45-tiny"
READY_TIMEOUT_S = 900.0


def skip_outside_lane() -> None:
    """The main suite has no vLLM: these modules skip there. In the lane nothing skips."""
    if not IN_LANE:
        pytest.skip(f"the real-server lane runs under `make test-real-server` ({LANE_ENV}=1)",
                    allow_module_level=True)


def manifest(
    port: int, health_port: int, base_config: Path, perf: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``MiniCPMSpeech`` the lane serves: the default profile, the model from a claim, no
    MPS and no graph precapture (neither exists on a CPU)."""
    body: dict[str, Any] = {
        "apiVersion": "serving.minicpm-speech.io/v1alpha1",
        "kind": "MiniCPMSpeech",
        "metadata": {"name": "speech", "namespace": "default", "uid": "real-server-lane"},
        "spec": {
            "model": {"pvc": {"claimName": "models", "path": "minicpmo45"},
                      "servedModelName": SERVED_MODEL},
            "profile": {"name": "default"},
            "runtime": {
                "mps": {"enabled": False},
                "graphPrecapture": False,
                "port": port,
                "healthPort": health_port,
                "baseDeployConfig": str(base_config),
            },
        },
    }
    if perf is not None:
        body["spec"]["perf"] = perf
    return body


@dataclass
class PodCommand:
    """What the operator renders for the lane's manifest, pointed at local paths."""

    argv: list[str]
    env: dict[str, str]
    deploy_config: dict[str, Any]
    port: int
    health_port: int


@dataclass
class Rendered:
    """What the operator makes of the lane's manifest: the resource, its parsed spec and its
    serving config (the deploy config a pod or a perf Job's arm is given)."""

    body: dict[str, Any]
    spec: Any
    cfg: Any

    def write_cpu_deploy_config(self, path: Path) -> dict[str, Any]:
        """The rendered deploy config under the lane's CPU overlay, written to ``path``."""
        from minicpm_speech_operator.profiles import merge_overrides

        from .deploy_config import cpu_overlay

        document = merge_overrides(yaml.safe_load(self.cfg.deploy_config), cpu_overlay())
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return document

    def localized(self, argv: list[str], model_dir: Path, config_in_pod: str,
                  config_path: Path) -> list[str]:
        """``argv`` with the pod's model folder and deploy-config file pointed at this
        machine's."""
        from minicpm_speech_operator.manifests import model_target

        local = {model_target(self.spec): str(model_dir), config_in_pod: str(config_path)}
        return [local.get(a, a) for a in argv]


def render(port: int, health_port: int, perf: dict[str, Any] | None = None) -> Rendered:
    from minicpm_speech_operator.serving_config import profile_document, serving_config
    from minicpm_speech_operator.spec import parse_spec

    from .deploy_config import base_deploy_path

    body = manifest(port, health_port, base_deploy_path(), perf)
    spec = parse_spec(body["spec"])
    return Rendered(body, spec, serving_config(spec, profile_document(spec, None)))


def render_pod_command(model_dir: Path, config_path: Path, run_dir: Path) -> PodCommand:
    from minicpm_speech_operator.manifests import (
        DEPLOY_CONFIG_DIR,
        DEPLOY_CONFIG_FILE,
        build_deployment,
        owner_of,
    )

    port, health_port = free_port(), free_port()
    rendered = render(port, health_port)
    document = rendered.write_cpu_deploy_config(config_path)
    deployment = build_deployment(owner_of(rendered.body), rendered.spec, rendered.cfg)
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "server"]
    argv = rendered.localized([*server["command"], *server["args"]], model_dir,
                              f"{DEPLOY_CONFIG_DIR}/{DEPLOY_CONFIG_FILE}", config_path)
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    env["HF_HOME"] = str(run_dir.parent / "hf-home")
    return PodCommand(argv, env, document, port, health_port)


@dataclass
class Pod:
    """The supervisor running the pod's command, and where to reach it."""

    process: subprocess.Popen[bytes]
    command: PodCommand
    run_dir: Path
    log: Path
    started: float
    ready_after_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.command.port}"

    @property
    def health(self) -> str:
        return f"http://127.0.0.1:{self.command.health_port}"

    @property
    def control(self) -> Path:
        return self.run_dir / "control"

    def server_pid(self) -> int:
        """The pid of ``vllm serve`` (the API server), the supervisor's child."""
        match = re.search(r"server started \(pid (\d+)\)", self.log_tail(10**7))
        assert match, f"the supervisor logged no server start\n{self.log_tail()}"
        return int(match.group(1))

    def log_tail(self, chars: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-chars:]

    def control_file(self, name: str) -> dict[str, Any]:
        path = self.control / name
        assert path.is_file(), f"no {name} in {self.control}\n{self.log_tail()}"
        document: dict[str, Any] = json.loads(path.read_text())
        return document

    def metrics(self) -> str:
        status, body = http_get(f"{self.health}/metrics", timeout=10.0)
        assert status == 200, f"/metrics answered {status}"
        return body.decode()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while http_get(f"{self.health}/readyz")[0] != 200:
            assert self.process.poll() is None, (
                f"the supervisor exited with {self.process.returncode} before ready\n"
                f"{self.log_tail()}")
            assert time.monotonic() < deadline, (
                f"not ready after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(2.0)
        self.ready_after_s = time.monotonic() - self.started

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return int(self.process.returncode)


def cpu_env(run_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the pod's command runs under on this machine: this venv's tools first,
    vLLM on its CPU platform, and the supervisor's test-only switch (no GPU to check here)."""
    env = {
        **os.environ,
        **(extra or {}),
        "MINICPM_SPEECH_RUN_DIR": str(run_dir),
        "MINICPM_SPEECH_TEST_WITHOUT_GPU": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    return env


def start_pod(model_dir: Path, work: Path) -> Pod:
    run_dir = work / "run"
    command = render_pod_command(model_dir, work / "deploy-config.yaml", run_dir)
    env = cpu_env(run_dir, command.env)
    log = work / "pod.log"
    process = subprocess.Popen(
        command.argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Pod(process, command, run_dir, log, time.monotonic())


def stream_and_kill(base: str, pid: int) -> tuple[list[bytes], BaseException | None, float]:
    """Stream a reply, SIGKILL ``pid`` at its first event, read on to the end; returns the
    lines read, the error the client got (if any) and the seconds from the kill to then.

    At the first event, not the first audio one: the tiny model's whole reply, ``[DONE]``
    included, can be on the wire by the time its first audio event is read, and a kill then
    no longer lands mid-stream."""
    from minicpm_speech_runtime.serving.warmup import warmup_request_body

    body = {**warmup_request_body(SERVED_MODEL, text="Kill test.", max_tokens=16), "stream": True}
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    lines: list[bytes] = []
    killed_at: float | None = None
    error: BaseException | None = None
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                lines.append(line)
                if killed_at is None and line.startswith(b"data:"):
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
    except (http.client.HTTPException, OSError) as exc:
        error = exc
    assert killed_at is not None, f"no event came: {lines[-3:]!r}"
    return lines, error, time.monotonic() - killed_at


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .model_folder import write_tiny_minicpmo

    return write_tiny_minicpmo(tmp_path_factory.mktemp("models") / "minicpmo45")


@pytest.fixture(scope="session")
def pod(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One pod for the lane's request tests, ready (its warm-up passed) before the first."""
    running = start_pod(model_dir, tmp_path_factory.mktemp("pod"))
    try:
        running.wait_ready()
        print(f"\nreal server ready after {running.ready_after_s:.0f} s")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def seed_tts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .seed_tts import write_seed_tts

    return write_seed_tts(tmp_path_factory.mktemp("seed-tts"))
