"""The DiT block's memory-bound steps: Triton kernels on CUDA, the same torch ops elsewhere.

Between its matmuls a block runs layer norms, residual updates, q/k head norms, a key-masked
softmax and the conv tail (norm, Mish). Run as torch ops they took more device time than the
matmuls (``runtime/bench-results/profile-h200-b9c21dc.json``, decode solve at 32 streams:
18.6 ms of layer-norm kernels, ~21 ms elementwise and copies, 9 ms softmax, 36 ms of GEMMs),
mostly because each is several passes over memory and the 64-wide head norms launch one
block per head. :mod:`.triton_kernels` does each in one pass.

Both implementations compute the same fp32 operations; the choice is made once per engine
(``EngineConfig.fused_kernels``, on by default where Triton and CUDA are present).
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

Pair = tuple[torch.Tensor, torch.Tensor]


def triton_usable(device: torch.device) -> bool:
    """Triton kernels run on CUDA devices, or anywhere under ``TRITON_INTERPRET=1``."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


class BlockKernels:
    """The memory-bound steps of a block; ``fused`` selects the Triton kernels."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        if fused:
            from . import triton_kernels

            self._t = triton_kernels

    @classmethod
    def for_device(cls, device: torch.device, wanted: bool) -> BlockKernels:
        return cls(wanted and triton_usable(device))

    def residual_norm(
        self,
        x: torch.Tensor,
        gate: torch.Tensor | None,
        y: torch.Tensor | None,
        norm: Pair,
        eps: float,
    ) -> Pair:
        """``x + gate * y`` (just ``x`` when ``y`` is None) and its layer norm with ``norm``."""
        if self.fused:
            return self._t.residual_norm(x, gate, y, norm[0], norm[1], eps)  # type: ignore[no-any-return]
        if y is not None:
            x = torch.addcmul(x, gate, y)  # type: ignore[arg-type]
        return x, F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps)

    def qk_heads(
        self, qkv: torch.Tensor, heads: int, head_dim: int, q_norm: Pair, k_norm: Pair, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split [R, F, 3 * H * D] into q [R, H, F, D] and k, v [R, F, H, D], q/k normed."""
        if self.fused:
            return self._t.qk_heads(qkv, heads, head_dim, q_norm, k_norm, eps)  # type: ignore[no-any-return]
        r, f, _ = qkv.shape
        q, k, v = qkv.view(r, f, 3, heads, head_dim).unbind(2)
        q = F.layer_norm(q, (head_dim,), *q_norm, eps)
        k = F.layer_norm(k, (head_dim,), *k_norm, eps)
        return q.transpose(1, 2), k, v

    def masked_softmax_(self, scores: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """Softmax over keys of ``scores + key_bias`` (0 or -inf per key), into ``scores``."""
        if self.fused:
            return self._t.masked_softmax_(scores, key_bias)  # type: ignore[no-any-return]
        return torch.softmax(scores.add_(key_bias), dim=-1)

    def norm_mish(self, x: torch.Tensor, norm: Pair, eps: float) -> torch.Tensor:
        if self.fused:
            return self._t.norm_mish(x, norm[0], norm[1], eps)  # type: ignore[no-any-return]
        return F.mish(F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps))
