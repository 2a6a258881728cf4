"""The reference ``stepaudio2.Token2wav`` streaming, driven for several streams at once.

``Token2wav`` keeps one stream's state on the instance, and its flow returns the estimator
cache as a view of one shared buffer (``CausalConditionalCFM.att_cache_buffer``), so a second
stream would overwrite the first one's history. This driver keeps, per stream, the prompt tuple,
the stream cache, the vocoder cache and its own pair of CFM cache buffers, and swaps them into
one ``Token2wav`` shell around each unmodified ``set_stream_cache`` / ``stream`` call: exactly
how the reference is used today, one stream's chunk at a time.

On the CPU the reference's hard-coded ``device='cuda'`` is redirected to the CPU (as in
``tests/runtime/test_prepare_parity.py``). Its scratch buffers are sized from the loaded model,
so the tiny test checkpoint runs too (at real dimensions the sizes equal the reference's).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ..assets import Code2WavModels

if TYPE_CHECKING:
    from ..engine.estimator import CausalConditionalCFM

CACHE_FRAMES = 1000  # the reference's buffer length


class _CpuTorch:
    """``torch`` as seen by ``stepaudio2.token2wav`` on a machine without CUDA."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def tensor(*args: Any, device: object = None, **kwargs: Any) -> torch.Tensor:
        return torch.tensor(*args, **kwargs)

    @staticmethod
    def zeros(*args: Any, device: object = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **kwargs)


@dataclass(slots=True)
class RefStream:
    prompt: tuple[torch.Tensor, ...]
    att_buffer: torch.Tensor
    cnn_buffer: torch.Tensor
    stream_cache: dict[str, torch.Tensor] | None = None
    hift_cache: dict[str, torch.Tensor] | None = None


class ReferenceDriver:
    def __init__(
        self, models: Code2WavModels, n_timesteps: int = 10, steps_buffered: int = 16
    ) -> None:
        import stepaudio2.token2wav as t2w

        self.module = t2w
        self.models = models
        ref = t2w.Token2wav.__new__(t2w.Token2wav)
        ref.float16, ref.n_timesteps = False, n_timesteps
        ref.flow, ref.hift, ref.cache, ref.stream_cache = models.flow, models.hift, None, None
        ref.mel_cache_len = 8
        ref.source_cache_len = ref.mel_cache_len * 480
        ref.speech_window = torch.from_numpy(np.hamming(2 * ref.source_cache_len)).to(models.device)
        ref.hift_cache_dict = {}
        self.ref = ref
        est = cast("CausalConditionalCFM", models.flow.decoder).estimator
        blk = est.blocks[0]
        self.shape_att = (
            len(est.blocks),
            2,
            blk.attn.num_heads,
            CACHE_FRAMES,
            2 * blk.attn.head_dim,
        )
        self.shape_cnn = (len(est.blocks), 2, 2 * est.in_proj.out_features, 2)
        self.steps_buffered = steps_buffered
        est.att_cache_buffer = torch.zeros(self.shape_att, device=models.device)
        est.cnn_cache_buffer = torch.zeros(self.shape_cnn, device=models.device)
        self.streams: dict[Any, RefStream] = {}

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        if self.models.device.type == "cuda":
            yield
            return
        saved = self.module.torch
        self.module.torch = _CpuTorch()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            self.module.torch = saved

    def add(self, stream_id: Any, voice: Any) -> None:
        n, dev = self.steps_buffered, self.models.device
        rs = RefStream(
            voice.as_reference_tuple(),
            torch.zeros((n, *self.shape_att), device=dev),
            torch.zeros((n, *self.shape_cnn), device=dev),
        )
        self.streams[stream_id] = rs
        with self._swap(rs), contextlib.redirect_stdout(io.StringIO()):
            self.ref._prepare_prompt = lambda _wav: rs.prompt
            rs.stream_cache, rs.hift_cache = self.ref.set_stream_cache(None)

    def stream(self, stream_id: Any, tokens: list[int], last: bool) -> np.ndarray:
        """One chunk of one stream through ``Token2wav.stream``; float waveform [samples]."""
        rs = self.streams[stream_id]
        with self._swap(rs):
            self.ref.stream_cache, self.ref.hift_cache_dict = rs.stream_cache, rs.hift_cache
            wav = self.ref.stream(tokens, None, last_chunk=last, return_waveform=True)
            rs.stream_cache, rs.hift_cache = self.ref.stream_cache, self.ref.hift_cache_dict
        return cast(np.ndarray, np.asarray(wav)[0])

    def remove(self, stream_id: Any) -> None:
        self.streams.pop(stream_id, None)

    @contextlib.contextmanager
    def _swap(self, rs: RefStream) -> Iterator[None]:
        cfm = cast("CausalConditionalCFM", self.models.flow.decoder)
        cfm.att_cache_buffer, cfm.cnn_cache_buffer = rs.att_buffer, rs.cnn_buffer
        self.ref.cache = rs.prompt
        with self._on_device():
            yield
