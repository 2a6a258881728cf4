"""Naturalness (MOS): a no-reference estimate of the listening-test score of one utterance.

The default predictor is DNSMOS P.808, the ONNX model (`model_v8.onnx`) that the `speechmos`
wheel ships. It was trained on ITU-T P.808 ratings of noisy and enhanced speech, so it hears
noise, clipping and lost bandwidth well; it was not trained on TTS, and its numbers are not
comparable with UTMOS or other MOS predictors. Only the P.808 model is run: the P.835 model
beside it costs ten times as much and did not separate clean from degraded speech here
(perf-jobs/README.md, "Speaker similarity and naturalness").

Importing this module loads no model library; the predictor imports onnxruntime and librosa
when it is built.
"""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from .quality_audio import NoSpeechError, SilentWavError, check_speech, read_speech
from .rescore import resample


class MosModelError(RuntimeError):
    """The MOS model is not installed, or returned no usable score."""


class MosPredictor(Protocol):
    """A no-reference MOS model. `name` is the model and its version, as reported."""

    name: str

    def predict(self, audio: np.ndarray, sample_rate: int) -> float:
        """MOS (1 to 5) of mono float32 audio at `sample_rate`; resampled as the model needs.

        Raises NoSpeechError when the audio holds nothing to score.
        """
        ...


def mos_of_wav(predictor: MosPredictor, path: Path) -> float:
    """MOS of one WAV of any supported rate and channel count.

    A missing, corrupt, empty or silent WAV raises a WavError subclass naming the file.
    """
    audio, rate = read_speech(path)
    try:
        return predictor.predict(audio, rate)
    except NoSpeechError as exc:
        raise SilentWavError(f"{path}: {exc}") from None


class DnsmosP808:
    """DNSMOS P.808 over the model file in the speechmos wheel, on onnxruntime's CPU.

    The model rates 9.01 s windows of 16 kHz speech from a 120-band log-mel spectrogram.
    As in the model's reference scoring, a shorter clip is repeated until it fills a window,
    windows start every second, and the clip's score is the mean over windows.
    """

    RATE = 16000
    WINDOW = 144160  # 9.01 s
    HOP = 16000
    MEL_HOP = 160  # 10 ms

    def __init__(self, *, threads: int = 1) -> None:
        try:
            version = metadata.version("speechmos")
            model = resources.files("speechmos") / "dnsmos_models" / "model_v8.onnx"
        except (metadata.PackageNotFoundError, ModuleNotFoundError):
            raise MosModelError(
                "speechmos is not installed: pip install 'minicpm-speech[perf]'"
            ) from None
        if not model.is_file():
            raise MosModelError(f"speechmos {version} has no dnsmos_models/model_v8.onnx")
        import librosa
        import onnxruntime as ort

        options = ort.SessionOptions()
        # One thread by default: the Job scores on CPU beside the client, and the figures
        # must not depend on how many cores the node happens to have free.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self.name = f"dnsmos-p808-speechmos-{version}"
        self._session = cast(Any, session)
        self._input = str(session.get_inputs()[0].name)
        self._librosa = cast(Any, librosa)

    def predict(self, audio: np.ndarray, sample_rate: int) -> float:
        check_speech(audio)
        clip = np.clip(resample(audio, sample_rate, self.RATE), -1.0, 1.0)
        scores = [self._score(w) for w in self._windows(clip)]
        mos = float(np.mean(scores))
        if not np.isfinite(mos):
            raise MosModelError(f"{self.name} returned a non-finite score")
        return mos

    def _windows(self, clip: np.ndarray) -> list[np.ndarray]:
        while len(clip) < self.WINDOW:
            clip = np.concatenate([clip, clip])
        count = int(len(clip) // self.RATE - self.WINDOW / self.RATE) + 1
        return [clip[i * self.HOP : i * self.HOP + self.WINDOW] for i in range(count)]

    def _score(self, window: np.ndarray) -> float:
        # One mel hop short of the window, so there are exactly the model's 900 frames.
        features = self._log_mel(window[: -self.MEL_HOP])  # [900, 120]
        out = self._session.run(None, {self._input: features[np.newaxis]})
        return float(np.asarray(out[0]).reshape(-1)[0])

    def _log_mel(self, x: np.ndarray) -> np.ndarray:
        mel = self._librosa.feature.melspectrogram(
            y=x, sr=self.RATE, n_fft=321, hop_length=self.MEL_HOP, n_mels=120
        )
        db = self._librosa.power_to_db(mel, ref=np.max)
        return np.asarray((db + 40) / 40, dtype=np.float32).T


def default_mos_predictor() -> MosPredictor:
    return DnsmosP808()
