"""Fixtures of the serving tests: fake GPU tools on PATH, a model folder, a deploy config,
and a running supervisor (a real subprocess) with helpers to probe it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.harness.net import free_port
from tests.harness.net import http_get as get

FAKES = Path(__file__).parent / "fakes"
REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "tests" / "profiles" / "golden" / "default.yaml"
TOKEN2WAV = ("flow.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2_25hz.onnx")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Pod:
    """The environment of one supervisor run."""

    root: Path
    env: dict[str, str]
    health_port: int = field(default_factory=free_port)
    server_port: int = field(default_factory=free_port)

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def mps_log(self) -> Path:
        return self.root / "mps-log" / "control.log"

    def events(self) -> list[dict[str, object]]:
        if not self.server_log.exists():
            return []
        return [json.loads(line) for line in self.server_log.read_text().splitlines()]

    def model(self, missing: tuple[str, ...] = ()) -> Path:
        folder = self.root / "model"
        (folder / "assets" / "token2wav").mkdir(parents=True, exist_ok=True)
        files = ["config.json", "assets/HT_ref_audio.wav",
                 *(f"assets/token2wav/{n}" for n in TOKEN2WAV)]
        for name in files:
            if name not in missing:
                (folder / name).write_text("x")
        return folder

    def deploy_config(self, extra: dict[str, object] | None = None, text: str | None = None,
                      **top: object) -> Path:
        path = self.root / "deploy-config.yaml"
        if text is None:
            document = yaml.safe_load(PROFILE.read_text())
            base = self.root / "minicpmo_4_5_turn.yaml"
            base.write_text("base_config: minicpmo_4_5.yaml\n")
            document["base_config"] = str(base)
            document["connectors"]["connector_of_shared_memory"]["extra"].update(extra or {})
            document.update(top)
            text = yaml.safe_dump(document)
        path.write_text(text)
        return path

    def args(self, *, mps: bool = True, precapture: bool = False, pct: int | None = 60,
             extra: tuple[str, ...] = (), command: list[str] | None = None,
             deploy: Path | None = None, model: Path | None = None) -> list[str]:
        own = ["serve", "--health-port", str(self.health_port),
               "--server-port", str(self.server_port)]
        if mps:
            own.append("--mps")
            if pct is not None:
                own += ["--mps-active-thread-percentage", str(pct)]
        else:
            own.append("--no-mps")
        own.append("--precapture" if precapture else "--no-precapture")
        # a drain waits for the fake's recorded streams (FAKE_METRICS) no longer than this
        own += ["--grace-seconds", "3", "--drain-seconds", "2", *extra]
        if command is None:
            command = ["vllm", "serve", str(model or self.model()), "--omni",
                       "--deploy-config", str(deploy or self.deploy_config(
                           {"cfm_graph_precapture": precapture, "batched_code2wav": False})),
                       "--host", "0.0.0.0", "--port", str(self.server_port),
                       "--served-model-name", "minicpm-o"]
        return [*own, "--", *command]


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pod:
    for sub in ("mps-pipe", "mps-log", "run"):
        (tmp_path / sub).mkdir()
    env = {
        "PATH": f"{FAKES}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
        "MINICPM_SPEECH_RUN_DIR": str(tmp_path / "run"),
        "FAKE_SERVER_LOG": str(tmp_path / "server.log"),
        "PYTHONPATH": f"{REPO / 'runtime'}:{REPO / 'operator'}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in list(os.environ):
        if key.startswith("FAKE_") and key != "FAKE_SERVER_LOG":
            monkeypatch.delenv(key)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # the pod sets its own
        monkeypatch.delenv(key, raising=False)
    return Pod(tmp_path, env)


@dataclass
class Running:
    pod: Pod
    proc: subprocess.Popen[str]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.pod.health_port}{path}"

    def wait_ready(self, timeout: float = 30.0) -> list[int]:
        """Poll /readyz until 200; returns every status seen."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, _ = get(self.url("/readyz"))
            seen.append(code)
            if code == 200:
                return seen
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"not ready; statuses {sorted(set(seen))}; {self.output()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        out, err = self.proc.communicate()
        return f"stdout={out!r} stderr={err!r}"

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)


@pytest.fixture
def start(pod: Pod) -> Iterator[object]:
    running: list[Running] = []

    def _start(args: list[str], **env: str) -> Running:
        proc = subprocess.Popen(
            [sys.executable, "-m", "minicpm_speech_runtime.serving.cli", *args],
            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        r = Running(pod, proc)
        running.append(r)
        return r

    yield _start
    for r in running:
        if r.proc.poll() is None:
            r.proc.terminate()
            try:
                r.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
    # No MPS daemon of a test may outlive it.
    pid_file = pod.root / "mps-pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("an MPS daemon outlived its test")


