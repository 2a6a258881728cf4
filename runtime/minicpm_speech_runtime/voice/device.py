"""Device half of reference preparation: S3 quantize, speaker embedding, host-to-device copies.

Host tensors pass through staging buffers (pinned on CUDA, so copies are asynchronous) that
:data:`STAGING` counts while they are alive; a leak shows up there. On CUDA the work is
enqueued on whatever stream is current (the preparation pool makes that a side stream) and
nothing here waits for the device.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from .host import HostFeatures
from .speaker import SpeakerBackend

if TYPE_CHECKING:
    # s3tokenizer's ``S3TokenizerV2``, as far as this module reads it; for the type checker only

    class _Quantizer(torch.nn.Module):
        def encode(self, x: torch.Tensor) -> torch.Tensor: ...

    class S3TokenizerV2(torch.nn.Module):
        encoder: torch.nn.Module
        quantizer: _Quantizer


class StagingCounter:
    """Counts live staging buffers; each decrements when its tensor is freed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live = 0
        self.total = 0

    def _drop(self) -> None:
        with self._lock:
            self.live -= 1

    def stage(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        buf = t.pin_memory() if device.type == "cuda" else t.clone()
        with self._lock:
            self.live += 1
            self.total += 1
        weakref.finalize(buf, self._drop)
        return buf


STAGING = StagingCounter()


@dataclass(frozen=True, slots=True)
class PreparedVoice:
    """What the flow needs of one reference voice; the reference's prompt tuple plus a key."""

    key: str
    prompt_tokens: torch.Tensor  # [1, n] int
    prompt_tokens_len: torch.Tensor  # [1] int32
    spk_emb: torch.Tensor  # [1, 192] float32
    prompt_mels: torch.Tensor  # [1, up_rate * n, 80] float32
    prompt_mels_len: torch.Tensor  # [1] int32

    def as_reference_tuple(self) -> tuple[torch.Tensor, ...]:
        """Same order as ``Token2wav._prepare_prompt`` returns."""
        return (
            self.prompt_tokens,
            self.prompt_tokens_len,
            self.spk_emb,
            self.prompt_mels,
            self.prompt_mels_len,
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.as_reference_tuple()


class DeviceHalf:
    """Runs the model-dependent part of preparation on ``device``."""

    def __init__(
        self, tokenizer: torch.nn.Module, speaker: SpeakerBackend, device: torch.device
    ) -> None:
        self.tokenizer = cast("S3TokenizerV2", tokenizer)
        self.speaker = speaker
        self.device = device

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or self.device.type == "cpu":
            return t.to(self.device)
        return STAGING.stage(t, self.device).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def run(self, host: HostFeatures) -> PreparedVoice:
        mel = self._to_device(host.s3_mel)
        mel_len = self._to_device(host.s3_mel_len)
        # quantize() without its >30 s branch, whose length test would sync the host; the
        # host half refuses references over 30 s, so this is the path quantize() takes.
        hidden, tokens_len = self.tokenizer.encoder(mel, mel_len)
        tokens = self.tokenizer.quantizer.encode(hidden)
        if tokens.shape[1] != host.n_tokens:
            raise RuntimeError(f"tokenizer gave {tokens.shape[1]} tokens, expected {host.n_tokens}")
        fbank = host.fbank if self.speaker.name == "onnxruntime" else self._to_device(host.fbank)
        spk = self._to_device(self.speaker.embed(fbank))
        prompt_mels = self._to_device(host.prompt_mel)
        mels_len = self._to_device(torch.tensor([host.prompt_mel_len], dtype=torch.int32))
        return PreparedVoice(host.key, tokens, tokens_len, spk, prompt_mels, mels_len)
