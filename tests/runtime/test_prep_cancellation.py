"""A cancelled request leaves no spool file, staging buffer or pin, in every job state."""

from __future__ import annotations

import threading

import pytest
import torch
from minicpm_speech_runtime.fixtures.synth import wav_bytes
from minicpm_speech_runtime.voice.device import STAGING, DeviceHalf
from minicpm_speech_runtime.voice.prep import PrepConfig, VoicePrep
from minicpm_speech_runtime.voice.speaker import make_speaker
from minicpm_speech_runtime.voice.wav import decode_wav


class GatedDevice(DeviceHalf):
    """Device half that can hold a job after its work is done, before it is installed."""

    def __init__(self, models) -> None:  # type: ignore[no-untyped-def]
        cpu = torch.device("cpu")
        super().__init__(
            models.tokenizer,
            make_speaker("onnxruntime", models.campplus, models.campplus_onnx, cpu),
            cpu,
        )
        self.hold: threading.Event | None = None
        self.done = threading.Event()

    def run(self, host):  # type: ignore[no-untyped-def]
        voice = super().run(host)
        self.done.set()
        if self.hold is not None:
            self.hold.wait(30)
        return voice


class GatedHost:
    def __init__(self) -> None:
        self.hold: threading.Event | None = None
        self.entered = threading.Event()

    def __call__(self, data: bytes):  # type: ignore[no-untyped-def]
        from minicpm_speech_runtime.voice.host import prepare_host

        self.entered.set()
        if self.hold is not None and threading.current_thread().name.startswith("voice-prep"):
            self.hold.wait(30)
        return prepare_host(data)


@pytest.fixture()
def rig(models, tmp_path):  # type: ignore[no-untyped-def]
    host, dev = GatedHost(), GatedDevice(models)
    prep = VoicePrep(
        dev, PrepConfig(workers=1, queue_size=8, cache_size=8, spool_dir=tmp_path / "s"), host
    )
    yield prep, host, dev
    if host.hold:
        host.hold.set()
    if dev.hold:
        dev.hold.set()
    prep.close()


def _key(data: bytes) -> str:
    return decode_wav(data).content_hash()


def _assert_clean(prep: VoicePrep) -> None:
    assert prep.wait_idle()
    assert prep.live_spool_files() == []
    assert prep.pins() == {}
    assert prep.pending_jobs() == 0
    assert STAGING.live == 0


def test_cancel_while_queued(rig) -> None:  # type: ignore[no-untyped-def]
    prep, host, _ = rig
    host.hold = threading.Event()
    first, second = wav_bytes(1.0, seed=1), wav_bytes(1.0, seed=2)
    prep.submit("first", first)
    host.entered.wait(10)
    prep.submit("second", second)  # queued behind the held worker
    prep.cancel("second")
    host.hold.set()
    prep.release("first")
    _assert_clean(prep)
    assert _key(second) not in prep.cache_keys()
    assert prep.counters.snapshot()["abandoned"] == 2  # both ended before chunk 0


def test_cancel_while_running(rig) -> None:  # type: ignore[no-untyped-def]
    prep, host, _ = rig
    host.hold = threading.Event()
    data = wav_bytes(1.0, seed=3)
    prep.submit("r", data)
    host.entered.wait(10)
    prep.cancel("r")
    host.hold.set()
    _assert_clean(prep)
    assert prep.cache_keys() == []


def test_cancel_finished_not_installed(rig) -> None:  # type: ignore[no-untyped-def]
    prep, _, dev = rig
    dev.hold = threading.Event()
    data = wav_bytes(1.0, seed=4)
    prep.submit("r", data)
    dev.done.wait(10)  # device work done, result not yet in the cache
    prep.cancel("r")
    dev.hold.set()
    _assert_clean(prep)
    assert prep.cache_keys() == []


def test_cancel_finished_not_acquired(rig) -> None:  # type: ignore[no-untyped-def]
    prep, _, _ = rig
    data = wav_bytes(1.0, seed=5)
    prep.submit("r", data)
    prep.wait_idle()
    assert prep.cache_keys() == [_key(data)]
    prep.cancel("r")
    _assert_clean(prep)
    assert prep.cache_keys() == []


def test_cancel_after_failure_with_spooled_file(rig) -> None:  # type: ignore[no-untyped-def]
    prep, _, _ = rig
    prep.submit("bad", b"RIFF....WAVEjunk")
    prep.wait_idle()
    assert len(prep.live_spool_files()) == 1  # the failed job's file is still there
    prep.cancel("bad")
    _assert_clean(prep)


def test_shared_voice_survives_one_cancellation(rig) -> None:  # type: ignore[no-untyped-def]
    prep, _, _ = rig
    data = wav_bytes(1.0, seed=6)
    prep.submit("a", data)
    prep.submit("b", data)
    prep.wait_idle()
    prep.cancel("a")
    assert prep.pins() == {_key(data): {"b"}}
    voice = prep.acquire("b")
    assert voice.key == _key(data)
    prep.release("b")
    _assert_clean(prep)
    assert prep.cache_keys() == [_key(data)]  # it served a request: kept, unpinned, evictable


def test_cancel_after_chunk0_keeps_cache_entry_unpinned(rig) -> None:  # type: ignore[no-untyped-def]
    prep, _, _ = rig
    data = wav_bytes(1.0, seed=7)
    prep.submit("r", data)
    prep.wait_idle()
    prep.acquire("r")
    prep.cancel("r")
    _assert_clean(prep)
    assert prep.counters.snapshot()["abandoned"] == 0
