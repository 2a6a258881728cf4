"""The client command, its environment and the run plan equal the benchmark protocol."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from minicpm_speech_perf import protocol

# The protocol's client command and extra body, as written in benchmark-protocol.md.
PROTOCOL_COMMAND = r"""
vllm bench serve --omni --backend openai-chat-omni \
  --base-url http://HOST:PORT --endpoint /v1/chat/completions \
  --model MODEL --tokenizer MODEL_PATH --trust-remote-code \
  --dataset-name seed-tts --dataset-path DATASET_ROOT --seed-tts-locale en \
  --seed-tts-system-prompt "Please read the following text out loud in English." \
  --num-prompts N --max-concurrency C --no-oversample --disable-shuffle \
  --seed 42 --output-len 256 --num-warmups 0 --request-rate inf \
  --ready-check-timeout-sec 0 --disable-tqdm \
  --extra-body "$(cat extra-body.json)" \
  --percentile-metrics ttft,tpot,itl,e2el,audio_ttfp,audio_rtf,audio_duration \
  --metric-percentiles 50,95,99 \
  --save-result --save-detailed --result-dir DIR --result-filename NAME.json
"""

PROTOCOL_EXTRA_BODY = """
{"modalities": ["text", "audio"],
 "chat_template_kwargs": {"enable_thinking": false, "use_tts_template": true},
 "sampling_params_list": [
  {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 256, "seed": 42, "detokenize": true, "repetition_penalty": 1.0},
  {"temperature": 0.8, "top_p": 0.85, "top_k": 25, "max_tokens": 2048, "min_tokens": 50, "seed": 42, "detokenize": false, "repetition_penalty": 1.05},
  {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 65536, "detokenize": true}]}
"""  # noqa: E501

SHARED_PROTOCOL = Path(__file__).resolve().parents[3] / "shared" / "benchmark-protocol.md"

TARGET = protocol.ClientTarget(
    base_url="http://10.0.0.7:8091",
    model="openbmb/MiniCPM-o-4_5",
    tokenizer="/models/MiniCPM-o-4_5",
    dataset_root="/data/seed-tts-64",
)


def expected_argv(n: int, c: int) -> list[str]:
    text = (
        PROTOCOL_COMMAND.replace("http://HOST:PORT", TARGET.base_url)
        .replace("MODEL_PATH", TARGET.tokenizer)
        .replace("--model MODEL", f"--model {TARGET.model}")
        .replace("DATASET_ROOT", TARGET.dataset_root)
        .replace("--num-prompts N", f"--num-prompts {n}")
        .replace("--max-concurrency C", f"--max-concurrency {c}")
        .replace("--result-dir DIR", "--result-dir /artifacts/results")
        .replace("NAME.json", "A.1-c8-measured1.json")
    )
    argv = shlex.split(text.replace("\\\n", " "))
    i = argv.index("$(cat extra-body.json)")
    argv[i] = "EXTRA"
    return argv


def test_command_equals_protocol_flag_by_flag() -> None:
    argv = protocol.build_client_command(
        TARGET,
        num_prompts=64,
        concurrency=8,
        result_dir="/artifacts/results",
        result_filename="A.1-c8-measured1.json",
    )
    expected = expected_argv(64, 8)
    extra = argv[argv.index("--extra-body") + 1]
    argv[argv.index("--extra-body") + 1] = "EXTRA"
    assert len(argv) == len(expected)
    for pos, (got, want) in enumerate(zip(argv, expected, strict=True)):
        assert got == want, f"argument {pos}: {got!r} != {want!r}"
    assert json.loads(extra) == json.loads(PROTOCOL_EXTRA_BODY)


def test_embedded_protocol_text_matches_the_shared_contract() -> None:
    if not SHARED_PROTOCOL.is_file():
        pytest.skip("shared/benchmark-protocol.md is not beside this checkout")
    doc = SHARED_PROTOCOL.read_text()
    assert " ".join(PROTOCOL_COMMAND.split()) in " ".join(doc.split())
    assert " ".join(PROTOCOL_EXTRA_BODY.split()) in " ".join(doc.split())


def test_extra_body_is_the_protocol_json() -> None:
    assert json.loads(protocol.extra_body_json()) == json.loads(PROTOCOL_EXTRA_BODY)


def test_command_prefix_replaces_only_the_executable() -> None:
    target = protocol.ClientTarget(
        TARGET.base_url, TARGET.model, TARGET.tokenizer, TARGET.dataset_root,
        command_prefix=("python", "-m", "vllm.entrypoints.cli.main"),
    )  # fmt: skip
    argv = protocol.build_client_command(
        target, num_prompts=16, concurrency=16, result_dir="d", result_filename="w.json"
    )
    assert argv[:6] == ["python", "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--omni"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"num_prompts": 0}, "num_prompts"),
        ({"num_prompts": 65}, "num_prompts"),
        ({"num_prompts": True}, "num_prompts"),
        ({"concurrency": 3}, "concurrency"),
        ({"concurrency": 64}, "concurrency"),
        ({"result_filename": "../x.json"}, "result_filename"),
        ({"result_filename": "x.txt"}, "result_filename"),
        ({"result_dir": ""}, "result_dir"),
    ],
)
def test_command_inputs_are_validated(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {
        "num_prompts": 64,
        "concurrency": 8,
        "result_dir": "d",
        "result_filename": "r.json",
    }
    args.update(kwargs)
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.build_client_command(TARGET, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("base_url", "10.0.0.7:8091"), ("base_url", "http://h:1/v1"), ("model", " "),
     ("tokenizer", ""), ("dataset_root", "")],
)  # fmt: skip
def test_target_is_validated(field: str, value: str) -> None:
    fields = {
        "base_url": TARGET.base_url,
        "model": TARGET.model,
        "tokenizer": TARGET.tokenizer,
        "dataset_root": TARGET.dataset_root,
    }
    fields[field] = value
    with pytest.raises(protocol.ProtocolError, match=field):
        protocol.ClientTarget(**fields)  # type: ignore[arg-type]


def test_timing_env_turns_every_evaluator_off() -> None:
    env = protocol.timing_env({"PATH": "/bin", "SEED_TTS_WER_EVAL": "1"})
    assert env == {
        "PATH": "/bin",
        "SEED_TTS_WER_EVAL": "0",
        "SEED_TTS_SIM_EVAL": "0",
        "SEED_TTS_UTMOS_EVAL": "0",
    }


def test_quality_env_is_the_protocols() -> None:
    env = protocol.quality_env(
        {"PATH": "/bin"}, whisper_model="/asr/whisper-large-v3", audio_dir="/artifacts/wavs/c8"
    )
    assert env["SEED_TTS_WER_EVAL"] == "1"
    assert env["SEED_TTS_WER_SAVE_ITEMS"] == "1"
    assert env["SEED_TTS_EVAL_DEVICE"] == "cuda:0"
    assert env["SEED_TTS_HF_WHISPER_MODEL"] == "/asr/whisper-large-v3"
    assert env["SEED_TTS_WER_SAVE_AUDIO_DIR"] == "/artifacts/wavs/c8"
    with pytest.raises(protocol.ProtocolError, match="whisper_model"):
        protocol.quality_env({}, whisper_model="", audio_dir="x")
    with pytest.raises(protocol.ProtocolError, match="device"):
        protocol.quality_env({}, whisper_model="m", audio_dir="x", device="gpu0")


def test_sweep_plan_abba_with_baseline() -> None:
    plan = protocol.plan_sweep(["A", "B"], "dedicated", protocol.CONCURRENCIES)
    assert [v.label for v in plan] == ["A1", "B1", "B2", "A2"]
    assert all(v.fresh_server for v in plan)
    for visit in plan:
        runs = visit.runs
        assert len(runs) == 1 + 6 * 3
        assert (runs[0].kind, runs[0].concurrency, runs[0].num_prompts) == ("warmup", 16, 16)
        body = [(r.kind, r.concurrency, r.num_prompts, r.repeat) for r in runs[1:]]
        expected = []
        for c in (1, 2, 4, 8, 16, 32):
            expected += [("discard", c, 64, 0), ("measured", c, 64, 1), ("measured", c, 64, 2)]
        assert body == expected
    measured = [r for v in plan if v.arm == "B" for r in v.runs if r.kind == "measured"]
    assert len([r for r in measured if r.concurrency == 8]) == 4  # four per arm and C
    names = [r.name for v in plan for r in v.runs]
    assert len(set(names)) == len(names)
    assert plan[1].runs[7].result_filename == "B.1-c4-discard.json"


def test_sweep_plan_single_arm_and_live() -> None:
    single = protocol.plan_sweep(["cand"], "maintenance", [8, 1])
    assert [v.label for v in single] == ["cand1"]
    assert [r.concurrency for r in single[0].runs[1:4]] == [1, 1, 1]
    live = protocol.plan_sweep(["live"], "live", [1, 2])
    assert len(live) == 1 and not live[0].fresh_server
    with pytest.raises(protocol.ProtocolError, match="live"):
        protocol.plan_sweep(["A", "B"], "live", [1])


@pytest.mark.parametrize(
    ("arms", "mode", "conc", "needle"),
    [
        (["A", "B", "C"], "dedicated", [1], "two arms"),
        (["A", "A"], "dedicated", [1], "distinct"),
        (["1A"], "dedicated", [1], "arm name"),
        (["A.b"], "dedicated", [1], "arm name"),
        (["A"], "cluster", [1], "mode"),
        (["A"], "dedicated", [], "empty"),
        (["A"], "dedicated", [3], "among"),
        (["A"], "dedicated", [1, 1], "repeat"),
    ],
)
def test_plan_inputs_are_validated(
    arms: list[str], mode: str, conc: list[int], needle: str
) -> None:
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.plan_sweep(arms, mode, conc)


def test_quality_plan() -> None:
    visit = protocol.plan_quality("B", "dedicated", 32)
    assert visit.fresh_server
    assert [(r.kind, r.concurrency, r.num_prompts) for r in visit.runs] == [
        ("warmup", 16, 16),
        ("quality", 8, 64),
        ("quality", 1, 64),
        ("quality", 32, 64),
    ]
    assert protocol.quality_concurrencies(8) == (8, 1)
    assert protocol.quality_concurrencies(1) == (8, 1)


def test_example_configs_parse() -> None:
    from minicpm_speech_perf.config import load_mapping, parse_quality, parse_sweep

    examples = Path(__file__).resolve().parents[2] / "perf-jobs" / "examples"
    sweep = parse_sweep(load_mapping(examples / "sweep.yaml"))
    assert [a.name for a in sweep.arms] == ["A", "B"] and sweep.base_url == "http://127.0.0.1:8091"
    live = parse_sweep(load_mapping(examples / "live.yaml"))
    assert live.ready_url == "http://minicpm-speech.default.svc:8091/health"
    quality = parse_quality(load_mapping(examples / "wer.yaml"))
    assert quality.rescore is not None and quality.highest_gated_concurrency == 32
