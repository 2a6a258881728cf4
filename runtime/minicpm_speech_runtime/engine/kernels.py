"""The engine's memory-bound steps: Triton kernels on CUDA, the same torch ops elsewhere.

Between its matmuls a block runs layer norms, residual updates, q/k head norms, cache writes,
a key-masked softmax and the conv tail (norm, Mish). As torch ops they took more device time
than the matmuls (``runtime/bench-results/profile-h200-b9c21dc.json``, a decode solve at 32
streams: 18.6 ms of layer-norm kernels, ~21 ms elementwise and copies, 9 ms softmax, 36 ms of
GEMMs), because each is several passes over memory, the 64-wide head norms launch one block
per head, and the attention wrote, re-read and re-wrote a [rows, heads, frames, cache] score
tensor. :mod:`.triton_kernels` does each in one pass and attends without storing the scores;
HiFT's Snake activation, five elementwise kernels as torch ops, is one pass there too.

Both implementations compute the same fp32 operations; the choice is made once per engine
(``EngineConfig.fused_kernels``, on by default where Triton and CUDA are present).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

Pair = tuple[torch.Tensor, torch.Tensor]
log = logging.getLogger(__name__)


def triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on CUDA devices, or anywhere under ``TRITON_INTERPRET=1``."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


# How far the start-up check lets a kernel be from the torch ops computed in exact fp32. Both
# sides in fp32 agree to ~1e-6, so anything past 1e-3 is a broken kernel. A TF32 matmul rounds
# its operands to 10 mantissa bits, which moves a 64-wide attention output by ~1e-2: the TF32
# build of a kernel is held to a bound that only a wrong result exceeds.
SELF_CHECK_TOLERANCE = {"fp32": 1e-3, "tf32": 0.1}


@contextlib.contextmanager
def _matmul_tf32(on: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


class Kernels:
    """The memory-bound steps of a DiT block and HiFT's Snake; ``fused`` selects Triton."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        self.unfused_because: str | None = None  # why a wanted fused set fell back
        if fused:
            from . import triton_kernels

            self._t = triton_kernels

    @classmethod
    def for_device(cls, device: torch.device, wanted: bool) -> Kernels:
        """The Triton kernels when wanted, usable here and correct on this device (checked
        against the torch ops on small inputs); the torch ops otherwise, with the reason."""
        if not wanted:
            return cls(False)
        if importlib.util.find_spec("triton") is None:
            return cls._fallback("Triton is not installed", warn=device.type == "cuda")
        if not triton_runs_on(device):  # expected: no warning
            return cls._fallback(f"no Triton on a {device.type} device", warn=False)
        # the TF32 builds are the ones that serve when torch's matmuls use TF32 (the default)
        modes = ["fp32", "tf32"] if torch.backends.cuda.matmul.allow_tf32 else ["fp32"]
        try:
            fused = cls(True)
            worst = {mode: fused.self_check(device, tf32=mode == "tf32") for mode in modes}
        except Exception as exc:  # import, compile or launch: Triton raises many kinds
            return cls._fallback(f"{type(exc).__name__}: {exc}"[:300])
        for mode, diff in worst.items():
            if not diff <= SELF_CHECK_TOLERANCE[mode]:  # NaN fails too
                return cls._fallback(f"off from the torch ops by {diff:.3g} ({mode} matmuls)")
        return fused

    @classmethod
    def _fallback(cls, why: str, warn: bool = True) -> Kernels:
        log.log(
            logging.WARNING if warn else logging.DEBUG,
            "Code2Wav engine: Triton kernels not used (%s); running torch ops",
            why,
        )
        k = cls(False)
        k.unfused_because = why
        return k

    def self_check(self, device: torch.device, tf32: bool = False) -> float:
        """Worst max abs difference between these kernels, with TF32 matmuls or not, and the
        torch ops in exact fp32 on small inputs (compiles every kernel once, so a broken
        toolchain shows here, not mid-stream). The process's TF32 setting is left as it was."""
        g = torch.Generator().manual_seed(0)

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g).to(device)

        def both(
            run: Callable[[Kernels], tuple[torch.Tensor, ...]],
        ) -> list[tuple[torch.Tensor, torch.Tensor]]:
            with _matmul_tf32(tf32):
                ours = run(self)
            with _matmul_tf32(False):
                return list(zip(ours, run(ref), strict=True))

        # the shapes the engine runs: 64-wide heads, a 50-frame chunk, a cache range; each
        # row's 72 positions are pool frames in a scrambled order, as a long-lived pool has them
        ref, f, d = Kernels(False), 50, 64
        x, y, w, b = rnd(4, f, d), rnd(4, f, d), rnd(d), rnd(d)
        ends = torch.tensor([0, 1, f - 1, f], device=device)
        qkv, pools = rnd(4, f, 6 * d), rnd(2, 4 * 72, 2, d)  # k and v: [P, H, D]
        table = torch.randperm(4 * 72, generator=g).view(4, 72).to(device)
        pos = torch.arange(f, device=device).expand(4, -1)
        rows = (torch.arange(4, device=device)[:, None].expand(-1, f), pos)
        bias = torch.zeros(4, 1, 1, 72, device=device)
        bias[..., 60:] = float("-inf")
        key_range = torch.tensor([[0, 60]] * 4, device=device)

        # prompts packed end to end: segments [0, 13), [13, 50), keys of each its own
        first = torch.where(pos < 13, 0, 13)
        per_frame = torch.stack([first, torch.where(pos < 13, 13, f)], dim=-1)

        def attention(k: Kernels) -> tuple[torch.Tensor, ...]:
            kp, vp = pools.clone().unbind(0)
            q = k.qkv_into_cache(qkv, 2, d, (w, b), (b, w), 1e-6, kp, vp, table, rows)
            q = q.contiguous()
            packed = k.attention(q, kp, vp, table, torch.zeros_like(bias), per_frame)
            return q, kp, k.attention(q, kp, vp, table, bias.clone(), key_range), packed

        pairs = [
            *both(lambda k: k.residual_norm(x, w, y, (w, b), 1e-6)),
            *both(lambda k: k.conv_taps(x, y[:, :2], ends)),
            *both(lambda k: (k.conv_taps_packed(x, first),)),
            *both(lambda k: (k.norm_mish(x, (w, b), 1e-5),)),
            *both(lambda k: (k.snake(x, w[:f].abs() + 0.1),)),
            *both(attention),
        ]
        return max(float((a - c).abs().max()) for a, c in pairs)

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
            return self._t.residual_norm(x, gate, y, norm[0], norm[1], eps)
        if y is not None:
            assert gate is not None
            x = torch.addcmul(x, gate, y)
        return x, F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps)

    def qkv_into_cache(
        self,
        qkv: torch.Tensor,
        heads: int,
        head_dim: int,
        q_norm: Pair,
        k_norm: Pair,
        eps: float,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        table: torch.Tensor,
        rows: Pair,
    ) -> torch.Tensor:
        """Split [R, F, 3 * H * D]; q/k normed; k and v written into the pools [P, H, D] at
        the frames ``table`` [R, T] maps ``rows`` (row index, position per new frame) to;
        returns q [R, H, F, D]."""
        if self.fused:
            return self._t.qkv_into_cache(
                qkv, heads, head_dim, q_norm, k_norm, eps, k_pool, v_pool, table, rows[1]
            )
        r, f, _ = qkv.shape
        q, k, v = qkv.view(r, f, 3, heads, head_dim).unbind(2)
        q = F.layer_norm(q, (head_dim,), *q_norm, eps)
        k = F.layer_norm(k, (head_dim,), *k_norm, eps)
        frames = table[rows]  # [R, F]
        k_pool[frames] = k.to(k_pool.dtype)
        v_pool[frames] = v.to(v_pool.dtype)
        return q.transpose(1, 2)

    def attention(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        table: torch.Tensor,
        key_bias: torch.Tensor,
        key_range: torch.Tensor,
    ) -> torch.Tensor:
        """softmax(q k^T + key_bias) v -> [R, F, H * D]; row r's key at position t is frame
        ``table[r, t]`` of the pools [P, H, D]. ``key_bias`` is 0 or -inf per position and
        every valid key of row r lies in ``key_range[r]`` (which the fused kernel scans).
        A ``key_range`` of [R, F, 2] gives each frame its own range, outside which its keys
        are masked too (prompts packed end to end in one row)."""
        if self.fused:
            return self._t.attention(q, k_pool, v_pool, table, key_bias, key_range)
        # each row's keys gathered in position order (bf16 pools read back into q's type);
        # scores in one batched matmul (TF32 tensor cores when allowed)
        k = k_pool[table].to(q.dtype).transpose(1, 2)  # [R, H, T, D]
        v = v_pool[table].to(q.dtype).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)).add_(key_bias)  # [R, H, F, T]
        if key_range.dim() == 3:
            t = torch.arange(k.shape[2], device=q.device)
            mine = (t >= key_range[..., :1]) & (t < key_range[..., 1:])  # [R, F, T]
            scores.masked_fill_(~mine[:, None], float("-inf"))
        o = torch.matmul(torch.softmax(scores, dim=-1), v)
        return o.transpose(1, 2).flatten(2)

    def norm_mish(self, x: torch.Tensor, norm: Pair, eps: float) -> torch.Tensor:
        if self.fused:
            return self._t.norm_mish(x, norm[0], norm[1], eps)
        return F.mish(F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps))

    def conv_taps(self, x: torch.Tensor, cache: torch.Tensor, last_idx: torch.Tensor) -> Pair:
        """A kernel-3 causal conv's input as one matmul operand: x [R, F, C] after its 2 cache
        frames [R, 2, C] -> taps [R, F, 3C] (channel-major, tap-minor, as the conv weight is
        flattened) and the 2 frames before each row's end ``last_idx`` (the next cache)."""
        if self.fused:
            return self._t.conv_taps(x, cache, last_idx)
        y = torch.cat([cache.to(x.dtype), x], dim=1)  # [R, 2 + F, C]
        idx = last_idx[:, None] + torch.arange(2, device=y.device)
        new = y.gather(1, idx[:, :, None].expand(-1, -1, y.shape[2]))
        taps = y.unfold(1, 3, 1)  # [R, F, C, 3]
        return taps.reshape(*taps.shape[:2], -1), new

    def conv_taps_packed(self, x: torch.Tensor, seg_first: torch.Tensor) -> torch.Tensor:
        """As :meth:`conv_taps` for segments packed end to end in each row, each from a zero
        cache: a tap before the frame's segment start ``seg_first`` [R, F] reads zero."""
        if self.fused:
            return self._t.conv_taps_packed(x, seg_first)
        r, f, c = x.shape
        y = torch.cat([x.new_zeros(r, 2, c), x], dim=1)
        taps = y.unfold(1, 3, 1)  # [R, F, C, 3]: frames f - 2, f - 1, f
        src = torch.arange(f, device=x.device)[:, None] + torch.arange(-2, 1, device=x.device)
        taps = taps * (src >= seg_first[..., None])[:, :, None, :]
        return taps.reshape(r, f, -1)

    def snake(self, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """HiFT's Snake activation on [B, C, T]: five elementwise kernels as torch ops."""
        if self.fused:
            return self._t.snake(x, alpha)
        a = alpha[None, :, None]
        return x + (1.0 / (a + 1e-9)) * torch.pow(torch.sin(x * a), 2)
