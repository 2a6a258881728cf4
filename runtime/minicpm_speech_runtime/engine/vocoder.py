"""HiFT over many streams: one call per group of equal-length rows, per-stream overlap caches.

HiFT is a non-causal conv net, so rows are never zero-padded (padding would change a row's last
samples); rows are grouped by exact mel length instead (in steady state every continuing chunk
has 8 + 50 frames, so one group). The overlap caches and the cross-fade are the reference's
(``Token2wav.stream``): 8 mel frames, 3840 source samples, 3840 speech samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

MEL_CACHE = 8  # frames (160 ms)
SOURCE_CACHE = MEL_CACHE * 480  # 24 kHz samples per 50 Hz mel frame


@dataclass(slots=True)
class VocoderCache:
    mel: torch.Tensor  # [80, <=8]
    source: torch.Tensor  # [1, <=3840]
    speech: torch.Tensor  # [<=3840]

    @classmethod
    def empty(cls, device: torch.device) -> VocoderCache:
        z = torch.zeros
        return cls(z(80, 0, device=device), z(1, 0, device=device), z(0, device=device))


class BatchedVocoder:
    def __init__(self, hift: nn.Module, device: torch.device) -> None:
        self.hift = hift
        window = np.hamming(2 * SOURCE_CACHE)
        self.window = torch.from_numpy(window).to(device)  # float64, as the reference's

    @torch.inference_mode()
    def run(
        self, mels: list[torch.Tensor], caches: list[VocoderCache], last: list[bool]
    ) -> list[torch.Tensor]:
        """mels: per stream [80, F]; updates ``caches`` in place; returns speech [samples] each."""
        full = [torch.cat([c.mel, m], dim=1) for c, m in zip(caches, mels, strict=True)]
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (f, c) in enumerate(zip(full, caches, strict=True)):
            groups.setdefault((f.shape[1], c.source.shape[1]), []).append(i)
        out: list[torch.Tensor] = [torch.empty(0)] * len(mels)
        for idx in groups.values():
            self._group(idx, full, caches, last, out)
        return out

    def _group(
        self,
        idx: list[int],
        full: list[torch.Tensor],
        caches: list[VocoderCache],
        last: list[bool],
        out: list[torch.Tensor],
    ) -> None:
        mel = torch.stack([full[i] for i in idx])  # [G, 80, L]
        src = torch.stack([caches[i].source for i in idx])  # [G, 1, S]
        speech, source = self.hift(mel, src)  # [G, samples], [G, 1, samples]
        for j, i in enumerate(idx):
            out[i] = self._finish(speech[j : j + 1], source[j], mel[j], caches, i, last[i])

    def _finish(
        self,
        speech: torch.Tensor,  # [1, samples]
        source: torch.Tensor,  # [1, samples]
        mel: torch.Tensor,  # [80, L]
        caches: list[VocoderCache],
        i: int,
        last: bool,
    ) -> torch.Tensor:
        prev = caches[i].speech
        if prev.shape[-1] > 0:
            speech = _fade(speech, prev[None], self.window)
        caches[i] = VocoderCache(
            mel[:, -MEL_CACHE:].clone(),
            source[:, -SOURCE_CACHE:].clone(),
            speech[0, -SOURCE_CACHE:].clone(),
        )
        return speech[0] if last else speech[0, :-SOURCE_CACHE]


def _fade(fade_in: torch.Tensor, fade_out: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """The reference's ``fade_in_out``: cross-fade the overlap with a Hamming window."""
    n = window.shape[0] // 2
    fade_in = fade_in.clone()
    fade_in[..., :n] = fade_in[..., :n] * window[:n] + fade_out[..., -n:] * window[n:]
    return fade_in
