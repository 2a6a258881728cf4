"""Host half + device half == the reference's one-shot ``Token2wav._prepare_prompt``.

The reference method is run unmodified, on the CPU: ``.cuda()`` and ``device='cuda'`` are
redirected to the CPU, and ``torchaudio.load`` reads through libsndfile, the backend the
reference asks for (torchaudio 2.9 would otherwise need torchcodec). It gets the same tokenizer
module and an ONNX Runtime session on the same ``campplus.onnx``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
import torch
from minicpm_speech_runtime.fixtures.synth import wav_bytes
from minicpm_speech_runtime.voice.device import DeviceHalf
from minicpm_speech_runtime.voice.host import prepare_host
from minicpm_speech_runtime.voice.speaker import OrtSpeaker, make_speaker


class _CpuTorch:
    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def tensor(*args: object, device: object = None, **kwargs: object) -> torch.Tensor:
        return torch.tensor(*args, **kwargs)  # type: ignore[call-overload]


@pytest.fixture()
def reference(models, monkeypatch):  # type: ignore[no-untyped-def]
    import stepaudio2.token2wav as t2w
    import torchaudio

    def sf_load(path: str, *args: object, **kwargs: object) -> tuple[torch.Tensor, int]:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
        return torch.from_numpy(data.T.copy()), rate

    monkeypatch.setattr(torchaudio, "load", sf_load)
    monkeypatch.setattr(t2w, "torch", _CpuTorch())
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    ref = t2w.Token2wav.__new__(t2w.Token2wav)
    ref.audio_tokenizer = models.tokenizer
    ref.spk_model = OrtSpeaker(models.campplus_onnx).session
    ref.flow = models.flow
    return ref


@pytest.mark.parametrize(
    ("rate", "seconds"), [(16000, 2.0), (24000, 3.1), (44100, 2.4), (22050, 5.0), (48000, 1.2)]
)
def test_split_equals_one_shot(
    models, reference, tmp_path: Path, rate: int, seconds: float
) -> None:  # type: ignore[no-untyped-def]
    data = wav_bytes(seconds, rate, seed=rate)
    path = tmp_path / "prompt.wav"
    path.write_bytes(data)
    expected = reference._prepare_prompt(str(path))
    device = torch.device("cpu")
    half = DeviceHalf(
        models.tokenizer,
        make_speaker("onnxruntime", models.campplus, models.campplus_onnx, device),
        device,
    )
    got = half.run(prepare_host(data, models.up_rate)).as_reference_tuple()
    for want, have in zip(expected, got, strict=True):
        assert want.dtype == have.dtype
        assert torch.equal(want, have)


def test_torch_speaker_close_to_one_shot(models, reference, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = wav_bytes(4.0, 16000, seed=7)
    path = tmp_path / "prompt.wav"
    path.write_bytes(data)
    expected = reference._prepare_prompt(str(path))
    device = torch.device("cpu")
    half = DeviceHalf(
        models.tokenizer,
        make_speaker("torch", models.campplus, models.campplus_onnx, device),
        device,
    )
    got = half.run(prepare_host(data, models.up_rate)).as_reference_tuple()
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        if i == 2:  # speaker embedding: torch vs ONNX Runtime kernels
            cos = torch.nn.functional.cosine_similarity(want, have).item()
            assert cos >= 0.99999
        else:
            assert torch.equal(want, have)
