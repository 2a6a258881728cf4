"""Every bad environment: a one-line reason, a non-zero exit, nothing started."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from minicpm_speech_runtime.serving.cli import main

from .conftest import Pod

Case = Callable[[Pod, pytest.MonkeyPatch], list[str]]


def _no_gpu_tool(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    bare = pod.root / "bin"
    bare.mkdir()
    (bare / "nvidia-cuda-mps-control").symlink_to(Path(__file__).parent / "fakes" /
                                                   "nvidia-cuda-mps-control")
    mp.setenv("PATH", f"{bare}:{os.path.dirname(os.sys.executable)}:/usr/bin:/bin")
    return pod.args()


def _no_gpu(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    mp.setenv("FAKE_NO_GPU", "1")
    return pod.args()


def _pipe_unset(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    mp.delenv("CUDA_MPS_PIPE_DIRECTORY")
    return pod.args()


def _pipe_missing(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    mp.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pod.root / "nowhere"))
    return pod.args()


def _pipe_read_only(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    # A directory nobody can create files in, root included.
    mp.setenv("CUDA_MPS_PIPE_DIRECTORY", "/proc/1")
    return pod.args()


def _log_read_only(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    mp.setenv("CUDA_MPS_LOG_DIRECTORY", "/proc/1")
    return pod.args()


def _no_mps_control(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    bare = pod.root / "bin"
    bare.mkdir()
    (bare / "nvidia-smi").symlink_to(Path(__file__).parent / "fakes" / "nvidia-smi")
    mp.setenv("PATH", f"{bare}:{os.path.dirname(os.sys.executable)}:/usr/bin:/bin")
    return pod.args()


def _model_missing(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(model=pod.root / "no-model")


def _model_incomplete(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(model=pod.model(missing=("assets/token2wav/hift.pt", "config.json")))


def _default_prompt_missing(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(model=pod.model(missing=("assets/HT_ref_audio.wav",)))


def _deploy_missing(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.root / "absent.yaml")


def _deploy_unparseable(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config(text="stages: [\n  - {stage_id: 0\n"))


def _deploy_alias_bomb(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi",
                                                                  strict=True)]
    return pod.args(deploy=pod.deploy_config(text="\n".join(lines) + "\n"))


def _deploy_too_deep(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config(text="stages: " + "[" * 500 + "]" * 500 + "\n"))


def _deploy_not_mapping(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config(text="- 1\n- 2\n"))


def _deploy_wrong_type(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config({"micro_batch_size": "four"}))


def _deploy_unknown_key(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config({"batched_codewav": True}))


def _deploy_stage_without_id(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config(text="stages:\n  - {max_num_seqs: 4}\n"))


def _deploy_bad_base(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config(base_config="/nowhere/minicpmo_4_5_turn.yaml"))


def _setup_over_micro(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config({"micro_batch_size": 2,
                                              "setup_graph_batch_sizes": [1, 2, 4]}))


def _float16_batched(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(deploy=pod.deploy_config({"batched_code2wav": True,
                                              "token2wav_float16": True}))


def _precapture_mismatch(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(precapture=True, deploy=pod.deploy_config({"cfm_graph_precapture": False}))


def _no_separator(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return [a for a in pod.args() if a != "--"]


def _bad_port(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    args = pod.args()
    args[args.index("--health-port") + 1] = "70000"
    return args


def _pct_without_mps(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    args = pod.args(mps=False)
    return [args[0], "--mps-active-thread-percentage", "50", *args[1:]]


def _pct_out_of_range(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return pod.args(pct=0)


def _both_mps_flags(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    args = pod.args()
    return [args[0], "--no-mps", *args[1:]]


def _no_omni(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    return [a for a in pod.args() if a != "--omni"]


def _port_mismatch(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    args = pod.args()
    args[len(args) - 1 - args[::-1].index("--port") + 1] = "1234"
    return args


def _no_deploy_config(pod: Pod, mp: pytest.MonkeyPatch) -> list[str]:
    args = pod.args()
    i = args.index("--deploy-config")
    return args[:i] + args[i + 2:]


CASES: dict[str, tuple[Case, str, int]] = {
    "no nvidia-smi": (_no_gpu_tool, "no GPU visible: nvidia-smi is not on PATH", 1),
    "no GPU": (_no_gpu, "no GPU visible: nvidia-smi -L: No devices were found", 1),
    "pipe dir unset": (_pipe_unset, "CUDA_MPS_PIPE_DIRECTORY is not set", 1),
    "pipe dir missing": (_pipe_missing, "does not exist", 1),
    "pipe dir read-only": (_pipe_read_only, "CUDA_MPS_PIPE_DIRECTORY=/proc/1 is not writable", 1),
    "log dir read-only": (_log_read_only, "CUDA_MPS_LOG_DIRECTORY=/proc/1 is not writable", 1),
    "no mps control": (_no_mps_control, "nvidia-cuda-mps-control is not on PATH", 1),
    "model missing": (_model_missing, "no-model does not exist", 1),
    "model incomplete": (
        _model_incomplete, "incomplete: missing config.json, assets/token2wav/hift.pt", 1),
    "default prompt missing": (_default_prompt_missing, "missing assets/HT_ref_audio.wav", 1),
    "deploy config missing": (_deploy_missing, "absent.yaml does not exist", 1),
    "deploy config unparseable": (_deploy_unparseable, "is not valid YAML at line", 1),
    "deploy config not a mapping": (_deploy_not_mapping, "is not a mapping", 1),
    "deploy config alias bomb": (_deploy_alias_bomb, "limit of 16 YAML aliases (max_aliases)", 1),
    "deploy config too deep": (_deploy_too_deep, "limit of 32 levels", 1),
    "deploy config wrong type": (
        _deploy_wrong_type,
        "connectors.connector_of_shared_memory.extra.micro_batch_size: wrong type: expected"
        " integer, got string \"four\"",
        1),
    "deploy config unknown key": (
        _deploy_unknown_key,
        "extra.batched_codewav: unknown key 'batched_codewav'. Rename it to 'batched_code2wav'",
        1),
    "deploy config bad base": (_deploy_bad_base, "base_config /nowhere/", 1),
    "deploy config stage without id": (
        _deploy_stage_without_id, "stages.0 needs an integer stage_id", 1),
    "setup sizes over micro-batch": (
        _setup_over_micro,
        "extra.setup_graph_batch_sizes: setup graph batch size 4 is larger than"
        " micro_batch_size 2", 1),
    "float16 on the batched engine": (
        _float16_batched,
        "extra.token2wav_float16: token2wav_float16=true is not supported with"
        " batched_code2wav: the batched engine computes in float32 only", 1),
    "precapture mismatch": (
        _precapture_mismatch, "--precapture disagrees with cfm_graph_precapture: false", 1),
    "no separator": (_no_separator, "bad arguments: no server command after '--'", 2),
    "bad port": (_bad_port, "--health-port 70000 is not a port", 2),
    "percentage without mps": (_pct_without_mps, "needs --mps", 2),
    "percentage out of range": (_pct_out_of_range, "not in 1..100", 2),
    "both mps flags": (_both_mps_flags, "not allowed with argument", 2),
    "vllm without omni": (_no_omni, "'vllm serve' without --omni", 2),
    "port mismatch": (_port_mismatch, "server command listens on 1234", 2),
    "no deploy config": (_no_deploy_config, "without --deploy-config", 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_environment_one_line_and_nothing_started(
    name: str, pod: Pod, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case, expected, code = CASES[name]
    args = case(pod, monkeypatch)
    rc = main(args)
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert "\n" not in err, err
    assert err.startswith("minicpm-speech-runtime: "), err
    assert expected in err, err
    # Nothing started: no MPS daemon, no server, no run directory contents, no health port.
    assert not pod.mps_log.exists()
    assert not list((pod.root / "mps-pipe").iterdir())
    assert not pod.server_log.exists()
    assert not list((pod.root / "run").iterdir())


def test_what_vllm_omni_reads_of_a_deploy_config_is_accepted(tmp_path: Path) -> None:
    """Keys vLLM-Omni 0.30 reads and this project does not (a run on CPU needs some of them)
    pass the supervisor's check; only the Code2Wav extras are this project's to refuse."""
    import yaml
    from minicpm_speech_runtime.serving.config import load_deploy_config

    extras = {"batched_code2wav": True, "cfm_graph_precapture": False,
              "hift_graph_capture_batch_sizes": [1, 2], "token2wav_runtime_prompt_cache_size": 8}
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({
        "async_chunk": False,
        "session_mode": "turn",
        "stages": [{"stage_id": 0, "load_format": "dummy", "enforce_eager": True,
                    "max_num_seqs": 1}],
        "connectors": {"connector_of_shared_memory": {"name": "SharedMemoryConnector",
                                                      "extra": extras}},
    }))
    assert load_deploy_config(path) == extras


def test_the_gpu_check_is_skipped_only_by_the_test_switch(
    pod: Pod, monkeypatch: pytest.MonkeyPatch
) -> None:
    from minicpm_speech_runtime.serving.config import (
        TEST_WITHOUT_GPU_ENV,
        StartupError,
        parse_args,
        validate,
    )

    _no_gpu_tool(pod, monkeypatch)
    config = parse_args(pod.args(mps=False))
    with pytest.raises(StartupError, match="nvidia-smi is not on PATH"):
        validate(config)
    monkeypatch.setenv(TEST_WITHOUT_GPU_ENV, "0")  # only "1" switches it off
    with pytest.raises(StartupError, match="nvidia-smi is not on PATH"):
        validate(config)
    monkeypatch.setenv(TEST_WITHOUT_GPU_ENV, "1")
    assert validate(config).server == config.server
