"""The memo that spares a voice vLLM-Omni already normalised a second normalisation."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import numpy as np
import pytest
import torch
from minicpm_speech_runtime.serving.prompt_memo import (
    LockedPromptTable,
    PromptMemo,
    raw_reference,
)


def wave(seconds: float, seed: int, rate: int = 24000) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal(int(seconds * rate)).astype(np.float32) * 0.1)


def test_equal_samples_find_the_key_and_a_copy_is_kept() -> None:
    memo = PromptMemo()
    samples = wave(2.0, 1)
    memo.remember(samples, 24000, "key-a")
    assert memo.lookup(samples.clone(), 24000) == "key-a"
    samples.zero_()  # the caller reusing its buffer does not change what was remembered
    assert memo.lookup(wave(2.0, 1), 24000) == "key-a"
    assert memo.hits == 2


def test_a_single_different_sample_or_rate_is_a_miss() -> None:
    memo = PromptMemo()
    samples = wave(2.0, 1)
    memo.remember(samples, 24000, "key-a")
    changed = samples.clone()
    changed[1] += 1e-3  # between the fingerprint's strided samples: only the full compare sees it
    assert memo.lookup(changed, 24000) is None
    assert memo.lookup(samples, 16000) is None
    assert memo.lookup(samples[:-1], 24000) is None


def test_entries_and_bytes_are_bounded_oldest_first() -> None:
    memo = PromptMemo(max_entries=3)
    waves = [wave(1.0, seed) for seed in range(5)]
    for i, samples in enumerate(waves):
        memo.remember(samples, 24000, f"key-{i}")
    assert len(memo) == 3
    assert memo.lookup(waves[0], 24000) is None
    assert memo.lookup(waves[4], 24000) == "key-4"
    per = waves[0].numel() * 4
    small = PromptMemo(max_bytes=2 * per)
    for i, samples in enumerate(waves):
        small.remember(samples, 24000, f"key-{i}")
    assert len(small) == 2 and small.nbytes == 2 * per


def test_a_reference_longer_than_the_entry_bound_is_not_kept() -> None:
    memo = PromptMemo()
    huge = torch.zeros(5 * 2**20, dtype=torch.float32)  # 20 MiB
    memo.remember(huge, 24000, "key")
    assert len(memo) == 0 and memo.lookup(huge, 24000) is None


@pytest.mark.parametrize(
    "ref, rate",
    [
        ([0.1, 0.2], 24000),  # a list is vLLM-Omni's to convert
        (np.zeros(10, dtype=np.float32), 24000),
        (torch.zeros(2, 10), 24000),  # stereo: vLLM-Omni downmixes
        (torch.zeros(10, dtype=torch.float64), 24000),
        (torch.zeros(10), 0),
        (torch.zeros(10), -16000),
        (torch.zeros(10), 16000.5),
        (torch.zeros(10), "24000"),
        (torch.zeros(10), True),
        (torch.zeros(10), torch.tensor([16000, 24000])),
    ],
)
def test_calls_it_cannot_answer_are_left_to_vllm_omni(ref: object, rate: object) -> None:
    assert raw_reference(ref, rate) is None


def test_a_rate_given_as_a_tensor_or_float_is_read() -> None:
    samples = torch.zeros(10)
    assert raw_reference(samples, torch.tensor(24000))[1] == 24000  # type: ignore[index]
    assert raw_reference(samples, 16000.0)[1] == 16000  # type: ignore[index]


def test_the_shared_table_lets_a_loop_that_evicts_run_while_entries_arrive() -> None:
    """vLLM-Omni evicts by iterating its table's ``items()``; in a plain ``OrderedDict`` a
    voice the arrival watcher adds meanwhile ends that loop with a RuntimeError."""
    plain: OrderedDict[str, int] = OrderedDict(a=1, b=2)
    with pytest.raises(RuntimeError, match="mutated during iteration"):
        for key, _ in plain.items():
            plain[key + "-new"] = 0
    table = LockedPromptTable(a=1, b=2)
    for key, _ in table.items():
        table[key + "-new"] = 0  # the other thread's arrival, inside the evicting loop
    assert list(table) == ["a", "b", "a-new", "b-new"]
    assert isinstance(table, OrderedDict)  # what the plugin and vLLM-Omni check


def test_the_shared_table_keeps_its_order_and_entries_under_two_threads() -> None:
    """One thread adds and touches entries as the arrival watcher does, the other evicts the
    oldest beyond a bound as vLLM-Omni's trim does; nothing raises and the bound holds."""
    table = LockedPromptTable()
    errors: list[BaseException] = []
    bound = 8

    def arrive() -> None:
        try:
            for i in range(5000):
                table[f"v{i}"] = i
                if table.get(f"v{i - 1}") is not None:
                    with contextlib.suppress(KeyError):  # the trim may have taken it
                        table.move_to_end(f"v{i - 1}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    def trim() -> None:
        try:
            for _ in range(5000):
                while len(table) > bound:
                    victim = next(((k, v) for k, v in table.items()), None)
                    if victim is None:
                        break
                    table.pop(victim[0], None)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=arrive), threading.Thread(target=trim)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(table.items()) == len(table) == len(set(table))
    assert list(table)[-2:] == ["v4999", "v4998"]  # the last arrival, then the one it touched
    assert all(table[key] == int(key[1:]) for key in table)
