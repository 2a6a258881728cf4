"""The served bench's ``--served-extra``: a precision or a pool measured on vLLM-Omni's stage-2
path is set the way a profile sets it, and what the pod would refuse is refused before any
model is built."""

from __future__ import annotations

import pytest
from minicpm_speech_runtime.bench.served_bench import SERVED_EXTRAS, served_extras


def test_overrides_land_over_the_profile_extras_with_yaml_types() -> None:
    got = served_extras(["token2wav_precision=bf16", "token2wav_cache_mib=16960",
                         "micro_batch_size=16"])
    assert got["token2wav_precision"] == "bf16"
    assert got["token2wav_cache_mib"] == 16960
    assert got["micro_batch_size"] == 16
    assert {k: v for k, v in got.items() if k not in
            ("token2wav_precision", "token2wav_cache_mib", "micro_batch_size")} == {
        k: v for k, v in SERVED_EXTRAS.items() if k != "micro_batch_size"}
    assert served_extras([]) == SERVED_EXTRAS


@pytest.mark.parametrize(("pair", "named"), [
    ("token2wav_precision=fp8", "token2wav_precision"),
    ("token2wav_cache_mib=-3", "token2wav_cache_mib"),
    ("token2wav_precison=bf16", "token2wav_precison"),
    ("token2wav_precision", "KEY=VALUE"),
    ("=bf16", "KEY=VALUE"),
    ("token2wav_precision=" + "x" * 300, "KEY=VALUE"),
    ("token2wav_precision=[unclosed", "not YAML"),
])
def test_what_the_pod_would_refuse_is_refused_naming_it(pair: str, named: str) -> None:
    with pytest.raises(SystemExit) as refused:
        served_extras([pair])
    message = str(refused.value)
    assert named in message
    assert len(message) < 1000  # the key quoted capped; the allowed keys listed


def test_a_pool_too_small_for_one_longest_prompt_is_refused() -> None:
    with pytest.raises(SystemExit, match="token2wav_cache_mib"):
        served_extras(["token2wav_cache_mib=1"])
