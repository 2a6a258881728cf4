"""Stage 2's record of a refused request reaches the API server's request of the same id, and
only it, once; records nobody reads do not pile up."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from minicpm_speech_runtime.serving import refusals
from minicpm_speech_runtime.serving.api_errors import checked_outputs
from minicpm_speech_runtime.serving.refusals import Refusal, record_refusal, take_refusal


def test_the_api_servers_request_finds_stage_2s_record_under_the_engines_id(
        tmp_path: Path) -> None:
    record_refusal(tmp_path, "chatcmpl-9f1c-abcd1234", "non_finite_ref_audio", "NaN samples")
    assert take_refusal(tmp_path, "chatcmpl-9f1") is None, "another request's id is a prefix"
    found = take_refusal(tmp_path, "chatcmpl-9f1c")
    assert found == Refusal("non_finite_ref_audio", "NaN samples")
    assert take_refusal(tmp_path, "chatcmpl-9f1c") is None, "a record is read once"
    assert take_refusal(None, "chatcmpl-9f1c") is None


def test_a_hostile_request_id_stays_inside_the_directory(tmp_path: Path) -> None:
    path = record_refusal(tmp_path / "refusals", "../../etc/passwd" + "x" * 500, "r", "m")
    assert path is not None and path.parent == tmp_path / "refusals"
    assert len(path.name) <= refusals.MAX_NAME + len(refusals.SUFFIX)


def test_old_and_excess_records_are_removed_by_later_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusals, "MAX_FILES", 4)
    old = record_refusal(tmp_path, "old", "r", "m")
    assert old is not None
    os.utime(old, (0, 0))
    for i in range(6):
        record_refusal(tmp_path, f"req-{i}", "r", "m")
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert len(names) == 4 and "old.json" not in names and "req-5.json" in names


def test_an_unwritable_directory_costs_the_record_not_the_stage(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert record_refusal(blocker / "refusals", "req", "r", "m") is None


class Outputs:
    """Stands for vLLM-Omni's output generator of one request."""

    def __init__(self, n: int) -> None:
        self.n, self.closed = n, False

    def __aiter__(self) -> Outputs:
        return self

    async def __anext__(self) -> int:
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return self.n

    async def aclose(self) -> None:
        self.closed = True


async def drain(outputs: Any) -> list[int]:
    return [o async for o in outputs]


def test_a_refusal_ends_the_request_with_its_error_and_aborts_its_work(tmp_path: Path) -> None:
    source = Outputs(5)
    record_refusal(tmp_path, "chatcmpl-1-abcdefgh", "non_finite_ref_audio", "NaN")
    checked = checked_outputs(source, "chatcmpl-1", tmp_path, lambda r: ValueError(r.reason))
    with pytest.raises(ValueError, match="non_finite_ref_audio"):
        asyncio.run(drain(checked))
    assert source.closed and source.n == 4, "closed at the first output after the record"


def test_without_a_refusal_every_output_passes(tmp_path: Path) -> None:
    record_refusal(tmp_path, "chatcmpl-2-abcdefgh", "r", "another request's")
    checked = checked_outputs(Outputs(3), "chatcmpl-1", tmp_path, lambda r: ValueError())
    assert asyncio.run(drain(checked)) == [2, 1, 0]
