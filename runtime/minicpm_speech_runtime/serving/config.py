"""The supervisor's arguments, and every check made before anything is started.

Each check raises :class:`StartupError` with a one-line reason; :mod:`.cli` prints it and exits
non-zero. The checks, in order: arguments; a visible GPU (``nvidia-smi -L``); the MPS pipe and
log directories and ``nvidia-cuda-mps-control`` (with ``--mps``); the model folder (when the
server command's model is a local path); the deploy config (when the command names one).

The deploy config is vLLM-Omni's: the supervisor checks what this project reads of it, the
Code2Wav connector's ``extra`` (every key there must be one this project or vLLM-Omni 0.30.0
reads, so a misspelt option fails here rather than being ignored), its shape, and its
``base_config``; every other key is vLLM-Omni's to accept or refuse.

``MINICPM_SPEECH_TEST_WITHOUT_GPU=1`` skips the GPU check, for tests that run the pod's command
on a machine without a GPU; the operator never sets it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

EXTRA_PATH = ("connectors", "connector_of_shared_memory", "extra")
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
# What vLLM-Omni 0.30.0 reads from the Code2Wav connector's extra (its minicpmo_4_5 Code2Wav and
# stage-1 hook) beyond the keys profiles/schema.json describes; the vLLM-Omni lane checks this
# list against its source.
VLLM_OMNI_ONLY_EXTRAS = (
    "code2wav_bfloat16_attention_cache",
    "hift_graph_capture_batch_sizes",
    "prompt_cache_id",
    "prompt_wav",
    "token2wav_trt",
    "token2wav_trt_dtype",
    "token2wav_trt_max_batch",
)
TEST_WITHOUT_GPU_ENV = "MINICPM_SPEECH_TEST_WITHOUT_GPU"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


class StartupError(Exception):
    """A reason not to start; ``str()`` is the one line the supervisor prints."""

    def __init__(self, reason: str, code: int = 1) -> None:
        super().__init__(" ".join(reason.split()))
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise StartupError(f"bad arguments: {message}", code=2)


@dataclass(frozen=True)
class ServerCommand:
    argv: tuple[str, ...]
    is_vllm: bool = False
    model: str | None = None
    deploy_config: Path | None = None
    port: int | None = None
    served_model_name: str | None = None


@dataclass(frozen=True)
class SupervisorConfig:
    health_port: int
    server_port: int
    mps: bool
    mps_active_thread_percentage: int | None
    precapture: bool
    grace_seconds: float
    warmup_requests: int
    warmup_timeout_seconds: float
    server: ServerCommand
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batched_code2wav(self) -> bool:
        return bool(self.extras.get("batched_code2wav", False))


def _parser() -> _Parser:
    p = _Parser(prog="minicpm-speech-runtime serve", add_help=False)
    p.add_argument("--health-port", type=int, required=True)
    p.add_argument("--server-port", type=int, required=True)
    mps = p.add_mutually_exclusive_group(required=True)
    mps.add_argument("--mps", dest="mps", action="store_true")
    mps.add_argument("--no-mps", dest="mps", action="store_false")
    p.add_argument("--mps-active-thread-percentage", type=int)
    pre = p.add_mutually_exclusive_group(required=True)
    pre.add_argument("--precapture", dest="precapture", action="store_true")
    pre.add_argument("--no-precapture", dest="precapture", action="store_false")
    p.add_argument("--grace-seconds", type=float, default=25.0)
    p.add_argument("--warmup-requests", type=int, default=3)
    p.add_argument("--warmup-timeout-seconds", type=float, default=1800.0)
    return p


def parse_args(argv: Sequence[str]) -> SupervisorConfig:
    """Parse ``serve [options] -- COMMAND...``; raises :class:`StartupError` (code 2)."""
    args = list(argv)
    if not args or args[0] != "serve":
        raise StartupError("bad arguments: expected 'serve [options] -- COMMAND'", code=2)
    if "--" not in args:
        raise StartupError("bad arguments: no server command after '--'", code=2)
    cut = args.index("--")
    own, command = args[1:cut], args[cut + 1 :]
    if not command:
        raise StartupError("bad arguments: empty server command after '--'", code=2)
    ns = _parser().parse_args(own)
    for name in ("health_port", "server_port"):
        port = getattr(ns, name)
        if not 1 <= port <= 65535:
            raise StartupError(f"bad arguments: --{name.replace('_', '-')} {port} is not a port", 2)
    if ns.health_port == ns.server_port:
        raise StartupError("bad arguments: --health-port equals --server-port", code=2)
    pct = ns.mps_active_thread_percentage
    if pct is not None and not ns.mps:
        raise StartupError("bad arguments: --mps-active-thread-percentage needs --mps", code=2)
    if pct is not None and not 1 <= pct <= 100:
        raise StartupError(f"bad arguments: --mps-active-thread-percentage {pct} not in 1..100", 2)
    if ns.grace_seconds < 0 or ns.warmup_requests < 0 or ns.warmup_timeout_seconds <= 0:
        raise StartupError("bad arguments: negative grace, warm-up count or timeout", code=2)
    server = parse_server_command(command)
    if server.is_vllm and server.port is not None and server.port != ns.server_port:
        raise StartupError(
            f"bad arguments: server command listens on {server.port}, --server-port is "
            f"{ns.server_port}",
            code=2,
        )
    return SupervisorConfig(
        health_port=ns.health_port,
        server_port=ns.server_port,
        mps=ns.mps,
        mps_active_thread_percentage=pct,
        precapture=ns.precapture,
        grace_seconds=ns.grace_seconds,
        warmup_requests=ns.warmup_requests,
        warmup_timeout_seconds=ns.warmup_timeout_seconds,
        server=server,
    )


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise StartupError(f"bad arguments: server command option {name} has no value", 2)
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def parse_server_command(argv: Sequence[str]) -> ServerCommand:
    """Recognise ``vllm serve MODEL ... --omni``; any other command runs as given."""
    argv = tuple(argv)
    if Path(argv[0]).name != "vllm" or len(argv) < 2 or argv[1] != "serve":
        return ServerCommand(argv)
    if len(argv) < 3 or argv[2].startswith("-"):
        raise StartupError("bad arguments: 'vllm serve' without a model", code=2)
    if "--omni" not in argv:
        raise StartupError("bad arguments: 'vllm serve' without --omni", code=2)
    port_text = _option(argv, "--port")
    try:
        port = int(port_text) if port_text is not None else None
    except ValueError:
        raise StartupError(f"bad arguments: server --port {port_text!r}", code=2) from None
    deploy = _option(argv, "--deploy-config")
    return ServerCommand(
        argv,
        is_vllm=True,
        model=argv[2],
        deploy_config=Path(deploy) if deploy else None,
        port=port,
        served_model_name=_option(argv, "--served-model-name") or argv[2],
    )


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


def _profile_schema() -> dict[str, Any] | None:
    try:
        from minicpm_speech_operator.assets import asset_dir
    except ImportError:
        return None
    path = asset_dir("profiles") / "schema.json"
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _dig(document: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = document
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


# The batched engine's fixed chunking (minicpm_speech_runtime.engine.config; no torch here).
ENGINE_CHUNK_TOKENS = 25
ENGINE_LOOKAHEAD_TOKENS = 3


def batched_engine_refusal(extras: Mapping[str, Any]) -> str | None:
    """Why the batched Code2Wav engine cannot serve these extras (one line naming the key)."""
    if not extras.get("batched_code2wav", False):
        return None
    fixed = {
        "token2wav_float16": (False, "the batched engine computes in float32 only"),
        "codec_chunk_frames": (
            ENGINE_CHUNK_TOKENS, f"the engine decodes chunks of {ENGINE_CHUNK_TOKENS} tokens"),
        "codec_left_context_frames": (
            ENGINE_LOOKAHEAD_TOKENS,
            f"the engine keeps exactly {ENGINE_LOOKAHEAD_TOKENS} lookahead tokens"),
    }
    for key, (allowed, why) in fixed.items():
        if key in extras and extras[key] != allowed:
            return f"batched_code2wav: {key}={extras[key]!r} is not supported: {why}"
    for key, least in (("micro_batch_size", 1), ("cfm_max_graphs", 0),
                       ("token2wav_n_timesteps", 1)):
        value = extras.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            return f"batched_code2wav: {key}={value!r} is not supported: must be >= {least}"
    seconds = extras.get("ref_audio_max_seconds")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds <= 0:
        return f"batched_code2wav: ref_audio_max_seconds={seconds!r} is not supported: must be > 0"
    return None


def _own_checks(extras: Mapping[str, Any]) -> None:
    """What the schema cannot say, and the types when no schema is at hand."""
    bools = ("batched_code2wav", "cfm_graph_precapture", "token2wav_allow_tf32",
             "token2wav_float16")
    ints = ("micro_batch_size", "cfm_max_graphs", "reference_prep_workers",
            "reference_cache_size")
    for key in bools:
        if key in extras and not isinstance(extras[key], bool):
            raise StartupError(f"deploy config: {'.'.join(EXTRA_PATH)}.{key} must be a boolean")
    for key in ints:
        value = extras.get(key)
        if key in extras and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise StartupError(f"deploy config: {'.'.join(EXTRA_PATH)}.{key} must be an integer")
    refusal = batched_engine_refusal(extras)
    if refusal is not None:
        raise StartupError(f"deploy config: {refusal}")
    sizes = extras.get("setup_graph_batch_sizes")
    micro = extras.get("micro_batch_size")
    if isinstance(sizes, list) and isinstance(micro, int):
        over = [s for s in sizes if isinstance(s, int) and s > micro]
        if over:
            raise StartupError(
                f"deploy config: setup_graph_batch_sizes {over} exceed micro_batch_size {micro}"
            )
    initial, minimum = extras.get("code2wav_initial_batch_size"), extras.get(
        "code2wav_min_batch_size", 1
    )
    if isinstance(initial, int) and isinstance(minimum, int) and 0 < initial < minimum:
        raise StartupError(
            "deploy config: code2wav_initial_batch_size must be 0 or >= code2wav_min_batch_size"
        )


def load_deploy_config(path: Path) -> dict[str, Any]:
    """Parse and validate a deploy config; returns the Code2Wav connector extras."""
    if not path.is_file():
        raise StartupError(f"deploy config {path} does not exist")
    try:
        document = yaml.safe_load(path.read_text())
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
    extras = _dig(overlay, EXTRA_PATH)
    if extras is None:
        return {}
    if not isinstance(extras, dict):
        raise StartupError(f"deploy config {path}: {'.'.join(EXTRA_PATH)} is not a mapping")
    _check_extras(path, extras)
    _own_checks(extras)
    return extras


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


def _check_extras(path: Path, extras: Mapping[str, Any]) -> None:
    """The Code2Wav extras against the schema's ``code2wavExtra`` (types and ranges), with the
    keys only vLLM-Omni reads allowed as they are."""
    schema = _profile_schema()
    if schema is None:
        return
    import jsonschema

    extra = dict(schema["$defs"]["code2wavExtra"])
    extra["properties"] = {**extra["properties"], **{k: {} for k in VLLM_OMNI_ONLY_EXTRAS}}
    validator = jsonschema.Draft202012Validator({**extra, "$defs": schema["$defs"]})
    errors = sorted(validator.iter_errors(dict(extras)), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join([*EXTRA_PATH, *(str(p) for p in first.absolute_path)])
        raise StartupError(f"deploy config {path}: {where}: {first.message}"[:500])


def validate(config: SupervisorConfig) -> SupervisorConfig:
    """Every environment and config check; returns the config with the extras filled in."""
    if os.environ.get(TEST_WITHOUT_GPU_ENV) != "1":
        check_gpu()
    if config.mps:
        check_mps_environment()
    server = config.server
    if server.is_vllm and server.model is not None and is_local_model(server.model):
        check_model_folder(server.model)
    extras: dict[str, Any] = {}
    if server.is_vllm:
        if server.deploy_config is None:
            raise StartupError("bad arguments: 'vllm serve --omni' without --deploy-config", 2)
        extras = load_deploy_config(server.deploy_config)
        declared = extras.get("cfm_graph_precapture")
        if declared is not None and bool(declared) != config.precapture:
            flag = "--precapture" if config.precapture else "--no-precapture"
            raise StartupError(
                f"{flag} disagrees with cfm_graph_precapture: {str(declared).lower()} in the "
                "deploy config"
            )
    return dataclasses.replace(config, extras=extras)
