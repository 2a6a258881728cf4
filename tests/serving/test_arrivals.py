"""The arrival spool between vLLM-Omni's API server and stage 2: what a user's request hands
over is read back exactly, and what is not a spooled reference never reaches preparation."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from minicpm_speech_runtime.serving import arrivals
from minicpm_speech_runtime.serving.arrivals import (
    Arrival,
    ArrivalWatcher,
    BadSpoolFile,
    read_spooled,
    spool_name,
    spool_reference,
)


def _voice(n: int = 16000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, n).astype(np.float32)


def test_a_spooled_reference_reads_back_bit_for_bit(tmp_path: Path) -> None:
    voice = _voice()
    path = spool_reference(tmp_path, "chatcmpl-1", voice, 16000, now=1234.5)
    assert path is not None and path.name == spool_name("chatcmpl-1")
    got = read_spooled(path)
    assert got.sample_rate == 16000 and got.arrived_at == 1234.5
    assert got.samples.dtype == np.float32 and np.array_equal(got.samples, voice)
    # only the finished file is visible: no temporary is left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_the_request_id_never_reaches_the_file_system_as_a_path(tmp_path: Path) -> None:
    path = spool_reference(tmp_path / "spool", "../../etc/passwd\x00", _voice(100), 16000)
    assert path is not None and path.parent == tmp_path / "spool"
    assert set(path.stem) <= set("0123456789abcdef")


@pytest.mark.parametrize(("samples", "rate"), [
    (np.zeros(0, np.float32), 16000),
    (np.zeros(10, np.float32), 0),
    (np.zeros(10, np.float32), arrivals.MAX_SAMPLE_RATE + 1),
])
def test_a_reference_out_of_bounds_is_not_spooled(
    tmp_path: Path, samples: np.ndarray, rate: int
) -> None:
    assert spool_reference(tmp_path, "r", samples, rate) is None
    assert list(tmp_path.iterdir()) == []


def test_a_full_spool_leaves_preparation_to_chunk_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals, "MAX_FILES", 2)
    assert spool_reference(tmp_path, "a", _voice(10), 16000) is not None
    assert spool_reference(tmp_path, "b", _voice(10), 16000) is not None
    assert spool_reference(tmp_path, "c", _voice(10), 16000) is None
    assert len(list(tmp_path.glob("*.ref"))) == 2


def test_an_unwritable_spool_is_skipped_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert spool_reference(blocker / "spool", "r", _voice(10), 16000) is None


def _header(magic: bytes = b"MCSR", version: int = 1, arrived: float = 1.0,
            rate: int = 16000, n: int = 4) -> bytes:
    return struct.pack("<4sBdII", magic, version, arrived, rate, n)


@pytest.mark.parametrize(("name", "data", "says"), [
    ("empty", b"", "is not a spooled reference"),
    ("magic", _header(magic=b"RIFF") + b"\0" * 16, "not a version-1 spool file"),
    ("version", _header(version=9) + b"\0" * 16, "not a version-1 spool file"),
    ("short", _header(n=4) + b"\0" * 12, "bytes for 4 samples"),
    ("long", _header(n=4) + b"\0" * 20, "bytes for 4 samples"),
    ("rate", _header(rate=0) + b"\0" * 16, "out of bounds"),
    ("count", _header(n=arrivals.MAX_SAMPLES + 1) + b"\0" * 16, "out of bounds"),
    ("nan", _header(arrived=float("nan")) + b"\0" * 16, "arrival time is not a number"),
])
def test_what_is_not_a_spooled_reference_is_refused(
    tmp_path: Path, name: str, data: bytes, says: str
) -> None:
    path = tmp_path / f"{name}.ref"
    path.write_bytes(data)
    with pytest.raises(BadSpoolFile, match=says) as info:
        read_spooled(path)
    assert len(str(info.value)) < 200


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.ref"
    with path.open("wb") as f:  # sparse: its size says enough
        f.truncate(64 + 4 * arrivals.MAX_SAMPLES)
    with pytest.raises(BadSpoolFile, match="is not a spooled reference"):
        read_spooled(path)


def test_the_watcher_hands_over_good_files_and_drops_the_rest(tmp_path: Path) -> None:
    taken: list[Arrival] = []
    outcomes: list[str] = []
    watcher = ArrivalWatcher(tmp_path, taken.append, outcomes.append, max_age_s=60.0)
    old = spool_reference(tmp_path, "old", _voice(8, 1), 16000, now=time.time() - 120)
    good = spool_reference(tmp_path, "good", _voice(8, 2), 24000)
    assert old is not None and good is not None
    os.utime(old, (time.time() - 10, time.time() - 10))  # oldest first
    (tmp_path / "junk.ref").write_bytes(b"junk")
    (tmp_path / ".half-written.tmp").write_bytes(b"MCSR")  # not ours to read yet
    assert watcher.poll_once() == 1
    assert [a.sample_rate for a in taken] == [24000]
    assert sorted(outcomes) == ["bad_file", "expired", "taken"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".half-written.tmp"]
    assert watcher.poll_once() == 0  # each file once


def test_a_failing_hand_over_is_counted_and_the_watcher_goes_on(tmp_path: Path) -> None:
    outcomes: list[str] = []
    seen = threading.Event()
    calls: list[int] = []

    def hand_over(arrival: Arrival) -> None:
        calls.append(arrival.sample_rate)
        if len(calls) == 1:
            raise RuntimeError("non_finite_ref_audio")
        seen.set()

    watcher = ArrivalWatcher(tmp_path, hand_over, outcomes.append, poll_s=0.001).start()
    try:
        spool_reference(tmp_path, "bad", _voice(8, 3), 16000)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.005)
        spool_reference(tmp_path, "good", _voice(8, 4), 22050)
        assert seen.wait(10)
    finally:
        watcher.close()
    assert calls == [16000, 22050] and outcomes == ["failed", "taken"]
    assert not watcher._thread.is_alive()
