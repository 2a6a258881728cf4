"""Speaker similarity (SIM): how close generated speech sounds to its reference voice.

SIM is the cosine of two speaker embeddings, one of the reference prompt WAV and one of the
generated WAV. The default encoder is Resemblyzer's d-vector (its wheel carries the weights;
it runs offline on CPU). Its numbers are comparable only with other Resemblyzer numbers: the
published Seed-TTS SIM uses a WavLM-based verification model and a different scale.

Importing this module loads no model library; the encoder imports torch when it is built.
"""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from .quality_audio import NoSpeechError, SilentWavError, check_speech, load_speech_16k

SPEAKER_RATE = 16000


class SpeakerModelError(RuntimeError):
    """The speaker model is not installed, or returned no usable embedding."""


class SpeakerEncoder(Protocol):
    """A speaker-embedding model. `name` is the model and its version, as reported."""

    name: str

    def embed(self, audio_16k: np.ndarray) -> np.ndarray:
        """An L2-normalised 1-D embedding of mono 16 kHz float32 speech.

        Raises NoSpeechError when the audio holds nothing to embed.
        """
        ...


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or a.ndim != 1:
        raise SpeakerModelError(f"embeddings of shapes {a.shape} and {b.shape} cannot be compared")
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if not np.isfinite(norms) or norms == 0.0:
        raise SpeakerModelError("a speaker embedding is zero or not finite")
    return float(np.clip(np.dot(a, b) / norms, -1.0, 1.0))


def embed_wav(encoder: SpeakerEncoder, path: Path, *, allow_resample: bool) -> np.ndarray:
    audio = load_speech_16k(path, allow_resample=allow_resample)
    try:
        return encoder.embed(audio)
    except NoSpeechError as exc:
        raise SilentWavError(f"{path}: {exc}") from None


def speaker_similarity(
    encoder: SpeakerEncoder, reference: Path, generated: Path, *, allow_resample: bool = False
) -> float:
    """Cosine similarity of the speaker embeddings of `reference` and `generated`.

    The reference prompt may have any rate and channel count. The generated WAV must be the
    server's format (24 kHz mono PCM16) unless `allow_resample`, so a run that saved the wrong
    format is noticed instead of scored. A missing, corrupt, empty or silent WAV raises a
    WavError subclass naming the file; nothing is scored as 0.
    """
    ref = embed_wav(encoder, reference, allow_resample=True)
    gen = embed_wav(encoder, generated, allow_resample=allow_resample)
    return cosine(ref, gen)


class ResemblyzerEncoder:
    """Resemblyzer's VoiceEncoder: a 3-layer LSTM d-vector (256-d) over 40-band mel frames.

    Its own preprocessing runs first (volume normalisation, long silences cut by the WebRTC
    voice detector), so pauses weigh little in the embedding. Embeddings come out
    of a ReLU, so the cosine of two of them lies in [0, 1].
    """

    def __init__(self, device: str = "cpu", *, threads: int = 1) -> None:
        try:
            version = metadata.version("Resemblyzer")
        except metadata.PackageNotFoundError:
            raise SpeakerModelError(
                "Resemblyzer is not installed: pip install 'minicpm-speech[perf]'"
            ) from None
        with warnings.catch_warnings():
            # scipy's old ndimage path and webrtcvad's pkg_resources import warn at import time
            # only; a Job log full of them hides the warnings that matter.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            import resemblyzer
        import torch

        self.name = f"resemblyzer-{version}"
        self._torch = cast(Any, torch)
        self._threads = threads
        self._preprocess = cast(Any, resemblyzer).preprocess_wav
        self._model = cast(Any, resemblyzer).VoiceEncoder(device=device, verbose=False)

    def embed(self, audio_16k: np.ndarray) -> np.ndarray:
        check_speech(audio_16k)
        speech = np.asarray(self._preprocess(audio_16k.astype(np.float32)), dtype=np.float32)
        if speech.size == 0:
            raise NoSpeechError("the voice detector found no speech")
        embedding = np.asarray(self._embed(speech), dtype=np.float32)
        norm = float(np.linalg.norm(embedding))
        if embedding.ndim != 1 or not np.isfinite(norm) or abs(norm - 1.0) > 1e-3:
            raise SpeakerModelError(f"{self.name} returned an unusable embedding (norm {norm})")
        return embedding

    def _embed(self, speech: np.ndarray) -> Any:
        # The LSTM takes hundreds of tiny steps, each a parallel region: with more threads
        # than idle cores their barriers spin, and one 3 s clip took up to 7 s of CPU on a busy
        # 2-core machine against 0.08 s on one thread. torch's thread count is global, so it
        # is set for the call only.
        before = self._torch.get_num_threads()
        self._torch.set_num_threads(self._threads)
        try:
            return self._model.embed_utterance(speech)
        finally:
            self._torch.set_num_threads(before)


def default_speaker_encoder() -> SpeakerEncoder:
    return ResemblyzerEncoder()
