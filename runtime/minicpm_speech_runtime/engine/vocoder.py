"""HiFT over many streams: one call per group of equal-length rows, per-stream overlap caches.

HiFT is a non-causal conv net, so rows are never zero-padded (padding would change a row's last
samples); rows are grouped by exact mel length instead (in steady state every continuing chunk
has 8 + 50 frames, so one group). The overlap caches and the cross-fade are the reference's
(``Token2wav.stream``): 8 mel frames, 3840 source samples, 3840 speech samples.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import CHUNK_TOKENS, LOOKAHEAD_TOKENS
from .graphs import Body, GraphDispatcher, GraphKey
from .kernels import Kernels
from .workspace import without_tf32

if TYPE_CHECKING:
    # The reference's HiFT (``flashcosyvoice.modules.hifigan``), as far as the vocoder reads
    # it; for the type checker only.

    class _SineGen(nn.Module):
        harmonic_num: int

    class _SourceModule(nn.Module):
        l_sin_gen: _SineGen

    class HiFTGenerator(nn.Module):
        stft_window: torch.Tensor
        istft_params: dict[str, int]
        m_source: _SourceModule
        _istft: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

MEL_CACHE = 8  # frames (160 ms)
SOURCE_CACHE = MEL_CACHE * 480  # 24 kHz samples per 50 Hz mel frame
CHUNK_FRAMES = 2 * CHUNK_TOKENS
# graphed (mel frames, cached source samples): a stream's first chunk, and every later one
GRAPH_SHAPES = ((CHUNK_FRAMES, 0), (MEL_CACHE + CHUNK_FRAMES, SOURCE_CACHE))
# A stream's last chunk holds whatever tokens remained (1 to 25 + 3): one row each, graphed
# at batch 1 as kind "hift_tail", after every other graph has its share of the budget. Eager,
# such a row costs HiFT's few hundred kernel launches: about 6 ms on an H200, once per stream.
TAIL_TOKENS = tuple(range(1, CHUNK_TOKENS + LOOKAHEAD_TOKENS + 1))
TAIL_SHAPES = tuple(
    shape for shape in ((MEL_CACHE + 2 * r, SOURCE_CACHE) for r in TAIL_TOKENS)
    if shape not in GRAPH_SHAPES  # 25 tokens: a continuing chunk's shape, batched as one
)


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
    def __init__(
        self,
        hift: nn.Module,
        device: torch.device,
        dispatcher: GraphDispatcher | None = None,
        batch_sizes: list[int] | None = None,
        kernels: Kernels | None = None,
        tf32: bool = True,
        bounded_convs: bool = True,
    ) -> None:
        self.hift = cast("HiFTGenerator", hift)
        # HiFT's own arithmetic, eager or captured: with ``tf32`` off, plain fp32 whatever
        # the rest of the engine runs in
        self.arithmetic: Callable[[], contextlib.AbstractContextManager[None]] = (
            contextlib.nullcontext if tf32 else lambda: without_tf32(bounded_convs))
        self.snakes = snake_overrides(hift, kernels or Kernels(fused=False))
        window = np.hamming(2 * SOURCE_CACHE)
        self.window = torch.from_numpy(window).to(device)  # float64, as the reference's
        self.dispatcher = dispatcher
        self.stft_window: torch.Tensor | None = None  # on the device once graphs are declared
        if dispatcher is not None and dispatcher.enabled and batch_sizes:
            self._declare(dispatcher, batch_sizes, device)

    def _declare(self, d: GraphDispatcher, sizes: list[int], device: torch.device) -> None:
        n = max(sizes)
        longest = max(f for f, _ in GRAPH_SHAPES + TAIL_SHAPES)
        self.mel = torch.zeros(n, 80, longest, device=device)
        self.src = torch.zeros(n, 1, SOURCE_CACHE, device=device)
        self.stft_window = self.hift.stft_window.to(device)
        self.harmonics = device_harmonics(self.hift, device)
        for b in sizes:
            for frames, source in GRAPH_SHAPES:
                key = GraphKey("hift", b, frames, source)
                d.declare(key, cast(Body, lambda key=key: self._body(key)), self._idle)
        for frames, source in TAIL_SHAPES:
            key = GraphKey("hift_tail", 1, frames, source)
            d.declare(key, cast(Body, lambda key=key: self._body(key)), self._idle)

    def _hift(self, mel: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """HiFT on [G, 80, L] mel and [G, 1, S] cached source; a graph when one fits."""
        g, frames, source = mel.shape[0], mel.shape[2], src.shape[2]
        d = self.dispatcher
        kind = "hift_tail" if (frames, source) in TAIL_SHAPES else "hift"
        key = None if d is None else d.select(kind, g, frames, extra=source)
        replay = None if key is None or d is None else d.replayer(key)
        if replay is None or key is None:
            # A shape without a graph (a stream's last chunk, mostly) runs eagerly, with the
            # graphs' host-sync-free inverse STFT where the device has one: torch.istft's
            # host check would stall the step until the device drained its queue.
            safe = (_graph_safe(self.hift, self.stft_window, self.harmonics)
                    if self.stft_window is not None else contextlib.nullcontext())
            with safe, _overridden(self.snakes), self.arithmetic():
                return self.hift(mel, src)  # type: ignore[no-any-return]
        self._idle()
        self.mel[:g, :, :frames].copy_(mel)
        self.src[:g, :, :source].copy_(src)
        speech, out_source = replay()
        return speech[:g].clone(), out_source[:g].clone()

    def _body(self, key: GraphKey) -> tuple[torch.Tensor, torch.Tensor]:
        mel = self.mel[: key.batch, :, : key.frames]
        src = self.src[: key.batch, :, : key.extra]
        if self.stft_window is None:  # set by _declare, before any body is declared
            raise RuntimeError("HiFT graph body without a device STFT window")
        with (
            _graph_safe(self.hift, self.stft_window, self.harmonics),
            _overridden(self.snakes),
            self.arithmetic(),
        ):
            return self.hift(mel, src)  # type: ignore[no-any-return]

    def _idle(self) -> None:
        self.mel.zero_()
        self.src.zero_()

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
        frames, source = full[idx[0]].shape[1], caches[idx[0]].source.shape[1]
        tail = GraphKey("hift_tail", 1, frames, source)
        if len(idx) > 1 and self.dispatcher is not None and tail in self.dispatcher.graphs:
            for i in idx:  # tail graphs hold one row: a replay each beats one eager run
                self._group([i], full, caches, last, out)
            return
        mel = torch.stack([full[i] for i in idx])  # [G, 80, L]
        src = torch.stack([caches[i].source for i in idx])  # [G, 1, S]
        speech, sources = self._hift(mel, src)  # [G, samples], [G, 1, samples]
        for j, i in enumerate(idx):
            out[i] = self._finish(speech[j : j + 1], sources[j], mel[j], caches, i, last[i])

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


def snake_overrides(hift: nn.Module, kernels: Kernels) -> list[tuple[nn.Module, Any]]:
    """HiFT's Snake modules and their forward through fused ``kernels`` (one pass each; as torch
    ops they were about half of HiFT's device time); none when the kernels are not fused."""
    if not kernels.fused:
        return []
    from stepaudio2.flashcosyvoice.modules.hifigan_components.layers import Snake

    out: list[tuple[nn.Module, Any]] = []
    for m in hift.modules():
        if isinstance(m, Snake):
            alpha = (m.alpha.exp() if m.alpha_logscale else m.alpha).detach()
            out.append((m, functools.partial(kernels.snake, alpha=alpha)))
    return out


@contextlib.contextmanager
def _overridden(forwards: list[tuple[nn.Module, Any]]) -> Iterator[None]:
    """The modules run the given forwards inside this context only: they are shared with
    whoever else runs this HiFT (the reference, in the parity runs)."""
    for m, forward in forwards:
        m.forward = forward
    try:
        yield
    finally:
        for m, _ in forwards:
            del m.forward


@contextlib.contextmanager
def _graph_safe(
    hift: HiFTGenerator, window: torch.Tensor, harmonics: torch.Tensor
) -> Iterator[None]:
    """HiFT with a device-resident STFT window and an inverse STFT that never syncs the host.

    ``torch.istft`` checks its window envelope on the host, which a graph cannot capture; the
    overlap-add below is the same computation without that check (the envelope of a periodic
    Hann window at hop n_fft/4 has no zeros inside the trimmed range). The NSF source builds
    its harmonic numbers as a host tensor on every call; inside this context it gets the same
    numbers already on the device.
    """
    saved = hift.stft_window
    hift.stft_window = window
    hift._istft = lambda magnitude, phase: _istft(hift.istft_params, window, magnitude, phase)
    try:
        with _device_harmonics(harmonics):
            yield
    finally:
        hift.stft_window = saved
        del hift._istft


class _DeviceFloatTensor:
    """Stands in for the NSF module's ``torch``: ``FloatTensor(data)`` of the one constant it
    builds returns a device copy made beforehand; everything else is the module's own."""

    def __init__(self, module_torch: Any, constant: torch.Tensor, data: list[Any]) -> None:
        # ``data`` comes from the host: reading ``constant`` back would be a device-to-host copy,
        # which fails inside a graph capture
        self._torch, self._constant, self._data = module_torch, constant, data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def FloatTensor(self, data: Any) -> torch.Tensor:  # the name of what it replaces
        if [[list(row) for row in plane] for plane in data] != self._data:
            raise ValueError("unexpected host tensor in the NSF source")
        return self._constant


def device_harmonics(hift: HiFTGenerator, device: torch.device) -> torch.Tensor:
    """The NSF source's harmonic numbers [1, 1, n] on ``device``; made before any capture."""
    n = int(hift.m_source.l_sin_gen.harmonic_num) + 1
    return torch.arange(1, n + 1, dtype=torch.float32, device=device).view(1, 1, n)


@contextlib.contextmanager
def _device_harmonics(harmonics: torch.Tensor) -> Iterator[None]:
    import stepaudio2.flashcosyvoice.modules.hifigan_components.layers as layers

    data = [[[float(i) for i in range(1, harmonics.shape[2] + 1)]]]
    saved = layers.torch
    layers.torch = _DeviceFloatTensor(saved, harmonics, data)
    try:
        yield
    finally:
        layers.torch = saved


def _istft(
    params: dict[str, int], window: torch.Tensor, magnitude: torch.Tensor, phase: torch.Tensor
) -> torch.Tensor:
    """``HiFTGenerator._istft``: [B, n_fft/2 + 1, T] magnitude and phase -> [B, hop * (T - 1)]."""
    n_fft, hop = params["n_fft"], params["hop_len"]
    magnitude = torch.clip(magnitude, max=1e2)
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    frames = torch.fft.irfft(spec, n=n_fft, dim=1) * window[:, None]  # [B, n_fft, T]
    t = frames.shape[2]
    size = (1, n_fft + hop * (t - 1))
    y = F.fold(frames, size, (1, n_fft), stride=(1, hop))[:, 0, 0]  # overlap-add
    sq = (window * window)[None, :, None].expand(1, n_fft, t)
    env = F.fold(sq, size, (1, n_fft), stride=(1, hop))[:, 0, 0]
    half = n_fft // 2
    return (y / env)[:, half : size[1] - half]
