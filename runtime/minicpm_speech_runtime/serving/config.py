"""The supervisor's arguments, and every check made before anything is started.

Each check raises :class:`StartupError` with a one-line reason; :mod:`.cli` prints it and exits
non-zero. The checks, in order: arguments; a visible GPU (``nvidia-smi -L``); the MPS pipe and
log directories and ``nvidia-cuda-mps-control`` (with ``--mps``); the model folder (when the
server command's model is a local path); the deploy config (when the command names one).

The deploy config is vLLM-Omni's: the supervisor checks what this project reads of it, the
Code2Wav connector's ``extra`` (with the contract's :func:`~minicpm_speech_contract.extras.
problems`, the check the operator makes before rolling a spec out; every key there must be one
this project or vLLM-Omni 0.30.0 reads, so a misspelt option fails here rather than being
ignored), its shape, and its ``base_config``; every other key is vLLM-Omni's to accept or
refuse.

``MINICPM_SPEECH_TEST_WITHOUT_GPU=1`` skips the GPU check, for tests that run the pod's command
on a machine without a GPU; the operator never sets it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from minicpm_speech_contract import supervisor
from minicpm_speech_contract.bounded import BoundedInputError, load_yaml
from minicpm_speech_contract.extras import EXTRA_PATH, first_problem
from minicpm_speech_contract.paths import dig
from minicpm_speech_contract.supervisor import ServerCommand

# What vLLM-Omni's Code2Wav stage reads from the model folder (minicpmo_4_5_code2wav.py:
# ``assets/token2wav`` for StepAudio2Token2WavCore, ``assets/HT_ref_audio.wav`` as the
# default prompt).
TOKEN2WAV_DIR = ("assets", "token2wav")
TOKEN2WAV_FILES = (
    "flow.yaml",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v2_25hz.onnx",
)
DEFAULT_PROMPT = ("assets", "HT_ref_audio.wav")
TEST_WITHOUT_GPU_ENV = "MINICPM_SPEECH_TEST_WITHOUT_GPU"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


class StartupError(Exception):
    """A reason not to start; ``str()`` is the one line the supervisor prints."""

    def __init__(self, reason: str, code: int = 1) -> None:
        super().__init__(" ".join(reason.split()))
        self.code = code


@dataclass(frozen=True)
class SupervisorConfig:
    """The command line's options (:class:`~minicpm_speech_contract.supervisor.SupervisorArgs`,
    field for field), the server command, and the extras its deploy config carries."""

    health_port: int
    server_port: int
    mps: bool
    mps_active_thread_percentage: int | None
    precapture: bool
    grace_seconds: float
    drain_seconds: float
    warmup_requests: int
    warmup_timeout_seconds: float
    server: ServerCommand
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batched_code2wav(self) -> bool:
        return bool(self.extras.get("batched_code2wav", False))


def parse_args(argv: Sequence[str]) -> SupervisorConfig:
    """Parse ``serve [options] -- COMMAND...``; raises :class:`StartupError` (code 2)."""
    try:
        args, command = supervisor.parse(argv)
        server = supervisor.parse_server_command(command)
    except supervisor.ArgsError as exc:
        raise StartupError(f"bad arguments: {exc}", code=2) from None
    if server.is_vllm and server.port is not None and server.port != args.server_port:
        raise StartupError(
            f"bad arguments: server command listens on {server.port}, --server-port is "
            f"{args.server_port}",
            code=2,
        )
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    return SupervisorConfig(**options, server=server)


# ------------------------------------------------------------------------- environment


def check_gpu(timeout: float = 20.0) -> str:
    """The first GPU line of ``nvidia-smi -L``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise StartupError("no GPU visible: nvidia-smi is not on PATH")
    try:
        out = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise StartupError(
            f"no GPU visible: nvidia-smi -L did not answer in {timeout:g} s"
        ) from None
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode != 0 or not gpus:
        detail = (out.stderr or out.stdout).strip().splitlines()
        why = detail[0] if detail else f"exit status {out.returncode}"
        raise StartupError(f"no GPU visible: nvidia-smi -L: {why}")
    return gpus[0]


def _writable_dir(env: str) -> Path:
    value = os.environ.get(env)
    if not value:
        raise StartupError(f"MPS is on but {env} is not set")
    path = Path(value)
    if not path.is_dir():
        raise StartupError(f"MPS directory {env}={path} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise StartupError(f"MPS directory {env}={path} is not writable: {exc.strerror}") from None
    return path


def check_mps_environment() -> tuple[Path, Path, str]:
    pipe, log = _writable_dir(MPS_PIPE_ENV), _writable_dir(MPS_LOG_ENV)
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        raise StartupError("MPS is on but nvidia-cuda-mps-control is not on PATH")
    return pipe, log, exe


def is_local_model(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def check_model_folder(model: str) -> None:
    """A local model folder must hold what vLLM-Omni's Code2Wav stage loads."""
    root = Path(model).expanduser()
    if not root.is_dir():
        raise StartupError(f"model folder {root} does not exist")
    missing = [] if (root / "config.json").is_file() else ["config.json"]
    token2wav = root.joinpath(*TOKEN2WAV_DIR)
    missing += [
        "/".join((*TOKEN2WAV_DIR, name))
        for name in TOKEN2WAV_FILES
        if not (token2wav / name).is_file() or (token2wav / name).stat().st_size == 0
    ]
    if not root.joinpath(*DEFAULT_PROMPT).is_file():
        missing.append("/".join(DEFAULT_PROMPT))
    if missing:
        raise StartupError(f"model folder {root} is incomplete: missing {', '.join(missing)}")


# ------------------------------------------------------------------------- deploy config


def load_deploy_config(path: Path) -> dict[str, Any]:
    """Parse and validate a deploy config; returns the Code2Wav connector extras."""
    if not path.is_file():
        raise StartupError(f"deploy config {path} does not exist")
    try:
        document = load_yaml(path.read_text(), field=f"deploy config {path}")
    except BoundedInputError as exc:
        raise StartupError(str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise StartupError(f"deploy config {path} is not valid YAML{where}") from None
    except OSError as exc:
        raise StartupError(f"deploy config {path} is unreadable: {exc.strerror}") from None
    if not isinstance(document, dict):
        raise StartupError(f"deploy config {path} is not a mapping")
    overlay = dict(document)
    base = overlay.pop("base_config", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise StartupError(f"deploy config {path}: base_config must be a file name")
        if base.startswith("/") and not Path(base).is_file():
            raise StartupError(f"deploy config {path}: base_config {base} does not exist")
    _check_shape(path, overlay)
    extras = dig(overlay, EXTRA_PATH)
    if extras is None:
        return {}
    problem = first_problem(extras, vllm_omni_internal=True)
    if problem is not None:
        raise StartupError(f"deploy config {path}: {problem.line()}"[:500])
    return dict(extras)


def _check_shape(path: Path, overlay: Mapping[str, Any]) -> None:
    """What vLLM-Omni needs to merge the overlay into its base: stages by ``stage_id``."""
    stages = overlay.get("stages")
    if stages is None:
        return
    if not isinstance(stages, list):
        raise StartupError(f"deploy config {path}: stages is not a list")
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict) or isinstance(stage.get("stage_id"), bool) \
                or not isinstance(stage.get("stage_id"), int):
            raise StartupError(f"deploy config {path}: stages.{i} needs an integer stage_id")
    for key in ("connectors", "platforms"):
        if key in overlay and not isinstance(overlay[key], dict):
            raise StartupError(f"deploy config {path}: {key} is not a mapping")


def validate(config: SupervisorConfig) -> SupervisorConfig:
    """Every environment and config check; returns the config with the extras filled in."""
    if os.environ.get(TEST_WITHOUT_GPU_ENV) != "1":
        check_gpu()
    if config.mps:
        check_mps_environment()
    server = config.server
    if server.is_vllm and server.model is not None and is_local_model(server.model):
        check_model_folder(server.model)
    return dataclasses.replace(config, extras=check_deploy_config(config))


def check_deploy_config(config: SupervisorConfig) -> dict[str, Any]:
    """The server command's deploy config, checked, and its Code2Wav extras."""
    server = config.server
    if not server.is_vllm:
        return {}
    if server.deploy_config is None:
        raise StartupError("bad arguments: 'vllm serve --omni' without --deploy-config", 2)
    extras = load_deploy_config(Path(server.deploy_config))
    declared = extras.get("cfm_graph_precapture")
    if declared is not None and bool(declared) != config.precapture:
        flag = "--precapture" if config.precapture else "--no-precapture"
        raise StartupError(
            f"{flag} disagrees with cfm_graph_precapture: {str(declared).lower()} in the "
            "deploy config"
        )
    return extras
