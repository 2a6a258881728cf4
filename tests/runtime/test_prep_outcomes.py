"""Every way a request meets chunk 0 gives the right voice and is counted once."""

from __future__ import annotations

import threading

import pytest
import torch
from minicpm_speech_runtime.fixtures.synth import wav_bytes
from minicpm_speech_runtime.voice.device import DeviceHalf
from minicpm_speech_runtime.voice.host import prepare_host
from minicpm_speech_runtime.voice.prep import PrepConfig, VoicePrep
from minicpm_speech_runtime.voice.speaker import make_speaker
from minicpm_speech_runtime.voice.wav import BadReference


class CountingDevice(DeviceHalf):
    def __init__(self, models) -> None:  # type: ignore[no-untyped-def]
        cpu = torch.device("cpu")
        super().__init__(
            models.tokenizer,
            make_speaker("onnxruntime", models.campplus, models.campplus_onnx, cpu),
            cpu,
        )
        self.runs = 0

    def run(self, host):  # type: ignore[no-untyped-def]
        self.runs += 1
        return super().run(host)


class GatedHost:
    """prepare_host that blocks on a gate for chosen inputs."""

    def __init__(self) -> None:
        self.gates: dict[bytes, threading.Event] = {}
        self.entered: dict[bytes, threading.Event] = {}
        self.fail_once: set[bytes] = set()

    def gate(self, data: bytes) -> threading.Event:
        self.entered[data] = threading.Event()
        self.gates[data] = threading.Event()
        return self.gates[data]

    def __call__(self, data: bytes):  # type: ignore[no-untyped-def]
        # Only the pool's workers wait; inline preparation at chunk 0 goes straight through.
        if data in self.gates and threading.current_thread().name.startswith("voice-prep"):
            self.entered[data].set()
            self.gates[data].wait(30)
        if data in self.fail_once:
            self.fail_once.discard(data)
            raise RuntimeError("transient failure")
        return prepare_host(data)


@pytest.fixture()
def setup(models, tmp_path):  # type: ignore[no-untyped-def]
    host = GatedHost()
    dev = CountingDevice(models)
    prep = VoicePrep(
        dev, PrepConfig(workers=2, queue_size=4, cache_size=8, spool_dir=tmp_path / "spool"), host
    )
    yield prep, host, dev
    for g in host.gates.values():
        g.set()
    prep.close()


def _equal(a, b) -> bool:  # type: ignore[no-untyped-def]
    return all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors(), strict=True))


def test_ahead_equals_inline(setup) -> None:  # type: ignore[no-untyped-def]
    prep, _, dev = setup
    data = wav_bytes(1.0, seed=1)
    assert prep.submit("r1", data)
    assert prep.wait_idle()
    voice = prep.acquire("r1")
    assert _equal(voice, dev.run(prepare_host(data)))
    prep.release("r1")
    assert prep.counters.snapshot()["ahead"] == 1
    assert prep.live_spool_files() == []


def test_shared_voice_is_prepared_once(setup) -> None:  # type: ignore[no-untyped-def]
    prep, _, dev = setup
    data = wav_bytes(1.0, seed=2)
    prep.submit("a", data)
    prep.wait_idle()
    prep.submit("b", data)
    prep.wait_idle()
    va, vb = prep.acquire("a"), prep.acquire("b")
    assert va is vb and dev.runs == 1
    snap = prep.counters.snapshot()
    assert (snap["ahead"], snap["cached"]) == (1, 1)
    prep.release("a")
    prep.release("b")


def test_late_job_falls_back_inline(setup) -> None:  # type: ignore[no-untyped-def]
    prep, host, dev = setup
    data = wav_bytes(1.0, seed=3)
    gate = host.gate(data)
    prep.submit("r", data)
    assert host.entered[data].wait(10)
    voice = prep.acquire("r")  # the job is still in its host half
    gate.set()
    prep.wait_idle()
    assert _equal(voice, dev.run(prepare_host(data)))
    snap = prep.counters.snapshot()
    assert (snap["late"], snap["inline_runs"]) == (1, 1)
    prep.release("r")
    assert prep.live_spool_files() == [] and prep.pins() == {}


def test_a_job_is_preparing_until_its_voice_is_ready(setup) -> None:  # type: ignore[no-untyped-def]
    prep, host, _ = setup
    data = wav_bytes(1.0, seed=6)
    gate = host.gate(data)
    assert not prep.preparing("r")  # no job yet
    prep.submit("r", data)
    assert host.entered[data].wait(10)
    assert prep.preparing("r") and prep.prepared_at("r") is None
    gate.set()
    assert prep.wait_idle()
    assert not prep.preparing("r") and prep.prepared_at("r") is not None
    prep.release("r")
    assert not prep.preparing("r")


def test_bad_audio_fails_only_its_request(setup) -> None:  # type: ignore[no-untyped-def]
    prep, _, _ = setup
    good, bad = wav_bytes(1.0, seed=4), b"RIFF\x00\x00"
    prep.submit("good", good)
    prep.submit("bad", bad)
    prep.wait_idle()
    with pytest.raises(BadReference):
        prep.acquire("bad")
    assert prep.acquire("good") is not None
    prep.release("bad")
    prep.release("good")
    snap = prep.counters.snapshot()
    assert (snap["failed"], snap["ahead"]) == (1, 1)
    assert prep.live_spool_files() == []


def test_internal_failure_falls_back_inline(setup) -> None:  # type: ignore[no-untyped-def]
    prep, host, _ = setup
    data = wav_bytes(1.0, seed=5)
    host.fail_once.add(data)
    prep.submit("r", data)
    prep.wait_idle()
    assert prep.acquire("r") is not None
    snap = prep.counters.snapshot()
    assert (snap["failed"], snap["inline_runs"]) == (1, 1)
    prep.release("r")


def test_queue_full_and_unsubmitted_go_inline(setup) -> None:  # type: ignore[no-untyped-def]
    prep, host, _ = setup
    blockers = [wav_bytes(1.0, seed=10 + i) for i in range(2)]
    gates = [host.gate(b) for b in blockers]
    for i, b in enumerate(blockers):
        prep.submit(f"busy{i}", b)
    for b in blockers:
        assert host.entered[b].wait(10)
    queued = [wav_bytes(1.0, seed=20 + i) for i in range(4)]
    assert all(prep.submit(f"q{i}", q) for i, q in enumerate(queued))
    overflow = wav_bytes(1.0, seed=30)
    assert not prep.submit("over", overflow)
    assert prep.acquire("over", overflow) is not None
    assert prep.acquire("never", wav_bytes(1.0, seed=31)) is not None
    for g in gates:
        g.set()
    prep.wait_idle()
    for rid in ["busy0", "busy1", "q0", "q1", "q2", "q3", "over", "never"]:
        prep.release(rid)
    snap = prep.counters.snapshot()
    assert (snap["queue_full"], snap["inline"]) == (1, 1)
    assert prep.live_spool_files() == [] and prep.pins() == {}
