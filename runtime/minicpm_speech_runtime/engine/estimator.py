"""Batched causal-DiT solve over many streams with preallocated, in-place caches.

The reference's ``DiT.forward_chunk`` concatenates each block's new keys/values onto the cache
and copies the result into a scratch buffer, once per block, Euler step and stream. Here every
slot owns fixed storage ``k, v: [steps, depth, 2 * slots, heads, T, head_dim]`` (two CFG rows per
slot, adjacent), a chunk's new keys/values are written in place at positions the host chose
(:class:`~.state.FrameMap`), and attention reads the slot range ``[lo, hi)`` as a view with a
key mask. Rows are ragged: frames past a row's length and rows not in this solve write only to
the slot's trash position and never update a conv cache.

The modules are the reference's; only their weights are used, with the same operations in the
same order per row, so a row's result equals the per-stream reference up to summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .graphs import GraphDispatcher, GraphKey


@dataclass(slots=True)
class SolveInputs:
    """One batched solve over slots ``[lo, hi)``; ``n = hi - lo`` streams, ``R = 2n`` rows."""

    lo: int
    hi: int
    x: torch.Tensor  # [n, 80, F] initial noise
    mu: torch.Tensor  # [n, 80, F] encoder output (zero past each row's length)
    spk: torch.Tensor  # [n, 80] projected speaker embedding
    cond: torch.Tensor  # [n, 80, F] prompt mel in setup, zeros in decode
    write_pos: torch.Tensor  # [R, F] int64 physical position of each new frame (trash if unused)
    key_mask: torch.Tensor  # [R, 1, 1, T] bool, valid keys including the new frames
    last_idx: torch.Tensor  # [R] int64 frames per row (conv caches keep the 2 before it)
    active: torch.Tensor  # [R] bool rows whose caches this solve updates


class BatchedEstimator:
    """Owns the estimator caches of all slots and runs the 10-step CFG Euler solve."""

    def __init__(self, cfm: nn.Module, slots: int, frames: int, n_timesteps: int) -> None:
        self.cfm = cfm
        self.est = cfm.estimator
        blocks = self.est.blocks
        attn = blocks[0].attn
        self.depth, self.heads, self.head_dim = len(blocks), attn.num_heads, attn.head_dim
        self.hidden = self.est.in_proj.out_features
        self.steps, self.slots, self.frames = n_timesteps, slots, frames
        p = next(self.est.parameters())
        shape = (n_timesteps, self.depth, 2 * slots, self.heads, frames, self.head_dim)
        self.k = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v = torch.zeros(shape, dtype=p.dtype, device=p.device)
        conv = (n_timesteps, self.depth, 2 * slots, 2 * self.hidden, 2)
        self.conv = torch.zeros(conv, dtype=p.dtype, device=p.device)
        self.cfg_rate = float(cfm.inference_cfg_rate)
        with torch.no_grad():  # the DiT's timestep embedding builds a host tensor: not capturable
            times = self._schedule(p.device, p.dtype)
            self.temb = torch.cat([self.est.t_embedder(t) for t, _ in times])  # [steps, hidden]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.conv))

    def t_span(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        t = torch.linspace(0, 1, self.steps + 1, device=device, dtype=dtype)
        return 1 - torch.cos(t * 0.5 * torch.pi)  # cosine schedule, as the reference

    def noise(self, offsets: list[int], frames: int) -> torch.Tensor:
        """[n, 80, F] slices of the CFM's fixed noise, each starting at its cache length."""
        noise = self.cfm.rand_noise[0]  # [80, N]
        idx = torch.tensor(offsets, device=noise.device)[:, None] + torch.arange(
            frames, device=noise.device
        )
        return noise[:, idx.clamp_(max=noise.shape[1] - 1)].permute(1, 0, 2)

    def _schedule(
        self, device: torch.device, dtype: torch.dtype
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(t [1], dt) of each Euler step, accumulated as ``solve_euler_chunk`` does."""
        t_span = self.t_span(device, dtype)
        t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        out = []
        for step in range(1, len(t_span)):
            out.append((t, dt))
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return out

    @torch.inference_mode()
    def solve(self, s: SolveInputs) -> torch.Tensor:
        """Euler-integrate ``s.x``; returns [n, 80, F]. Mirrors ``solve_euler_chunk``."""
        x = s.x
        mu_in = _interleave(s.mu)
        spk_in = _interleave(s.spk)
        cond_in = _interleave(s.cond)
        for step, (_, dt) in enumerate(self._schedule(s.x.device, s.x.dtype)):
            out = self.forward(step, x.repeat_interleave(2, 0), mu_in, spk_in, cond_in, s)
            d = out.view(x.shape[0], 2, *out.shape[1:])  # [n, 2, 80, F]: CFG rows adjacent
            dphi = (1.0 + self.cfg_rate) * d[:, 0] - self.cfg_rate * d[:, 1]
            x = x + dt * dphi
        return x

    def forward(
        self,
        step: int,
        x: torch.Tensor,  # [R, 80, F]
        mu: torch.Tensor,
        spk: torch.Tensor,  # [R, 80]
        cond: torch.Tensor,
        s: SolveInputs,
    ) -> torch.Tensor:
        est = self.est
        c = self.temb[step].expand(x.shape[0], -1).unsqueeze(1)  # [R, 1, hidden]
        spk_t = spk[:, :, None].expand(-1, -1, x.shape[2])
        h = torch.cat([x, mu, spk_t, cond], dim=1).transpose(1, 2)  # [R, F, 320]
        h = est.in_proj(h)
        for b, block in enumerate(est.blocks):
            h = self.block(step, b, block, h, c, s)
        return est.final_layer(h, c).transpose(1, 2)

    def block(
        self, step: int, b: int, block: nn.Module, x: torch.Tensor, c: torch.Tensor, s: SolveInputs
    ) -> torch.Tensor:
        mods = block.adaLN_modulation(c).chunk(9, dim=-1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods[:6]
        shift_conv, scale_conv, gate_conv = mods[6:]
        x = x + gate_msa * self.attention(
            step, b, block.attn, _mod(block.norm1(x), shift_msa, scale_msa), s
        )
        x = x + gate_conv * self.conv_block(
            step, b, block.conv, _mod(block.norm3(x), shift_conv, scale_conv), s
        )
        return x + gate_mlp * block.mlp(_mod(block.norm2(x), shift_mlp, scale_mlp))

    def attention(
        self, step: int, b: int, attn: nn.Module, x: torch.Tensor, s: SolveInputs
    ) -> torch.Tensor:
        rows, frames, _ = x.shape
        q = attn.q_norm(attn.to_heads(attn.to_q(x)))  # [R, H, F, D]
        k = attn.k_norm(attn.to_heads(attn.to_k(x)))
        v = attn.to_heads(attn.to_v(x))
        k_cache = self.k[step, b, 2 * s.lo : 2 * s.hi]  # [R, H, T, D] view of the slot range
        v_cache = self.v[step, b, 2 * s.lo : 2 * s.hi]
        r = torch.arange(rows, device=x.device)[:, None].expand(rows, frames)
        k_cache[r, :, s.write_pos] = k.transpose(1, 2)  # in place: [R, F, H, D]
        v_cache[r, :, s.write_pos] = v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=s.key_mask)
        return attn.proj(o.transpose(1, 2).reshape(rows, frames, -1))

    def conv_block(
        self, step: int, b: int, conv: nn.Module, x: torch.Tensor, s: SolveInputs
    ) -> torch.Tensor:
        """``CausalConvBlock.forward_chunk`` on ragged rows; caches updated for active rows."""
        cache = self.conv[step, b, 2 * s.lo : 2 * s.hi]  # [R, 2 * hidden, 2]
        c1, c2 = cache.split((conv.in_channels, conv.out_channels), dim=1)
        conv1, conv2 = conv.block[1], conv.block[6]
        y = torch.cat([c1, x.transpose(1, 2)], dim=2)  # [R, C, 2 + F]
        new1 = _last_two(y, s.last_idx)
        y = F.conv1d(y, conv1.weight, conv1.bias)
        y = conv.block[2:6](y)
        y = torch.cat([c2, y], dim=2)
        new2 = _last_two(y, s.last_idx)
        y = F.conv1d(y, conv2.weight, conv2.bias)
        new = torch.cat([new1, new2], dim=1)
        cache.copy_(torch.where(s.active[:, None, None], new, cache))
        return y.transpose(1, 2)


class GraphedSolve:
    """Static inputs/outputs of one estimator's solve and its grid of graphs.

    Keys are ``(kind, streams, frames)``: a solve over slots ``[0, streams)`` of ``frames``
    frames. Callers build their inputs at a key's shape (rows outside the solve inactive,
    frames past a row's length written to the trash position), :meth:`run` copies them into
    ``buf[:streams]`` and replays, or solves eager on those same inputs when refused.
    """

    def __init__(
        self,
        est: BatchedEstimator,
        dispatcher: GraphDispatcher,
        kind: str,
        batch_sizes: list[int],
        frame_buckets: list[int],
    ) -> None:
        self.est, self.dispatcher, self.kind = est, dispatcher, kind
        self.trash = est.frames - 1
        n, f, t = max(batch_sizes), max(frame_buckets), est.frames
        dev, dt = est.k.device, est.k.dtype
        self.x = torch.zeros(n, 80, f, device=dev, dtype=dt)
        self.mu, self.cond, self.out = (torch.zeros_like(self.x) for _ in range(3))
        self.spk = torch.zeros(n, 80, device=dev, dtype=dt)
        self.write = torch.full((2 * n, f), self.trash, dtype=torch.long, device=dev)
        self.mask = torch.zeros(2 * n, 1, 1, t, dtype=torch.bool, device=dev)
        self.last = torch.zeros(2 * n, dtype=torch.long, device=dev)
        self.active = torch.zeros(2 * n, dtype=torch.bool, device=dev)
        for b in batch_sizes:
            for fr in frame_buckets:
                key = GraphKey(kind, b, fr)
                dispatcher.declare(key, lambda key=key: self._body(key), self._idle)

    def select(self, streams: int, frames: int) -> GraphKey | None:
        return self.dispatcher.select(self.kind, streams, frames)

    def run(self, key: GraphKey | None, s: SolveInputs) -> torch.Tensor:
        """Solve ``s`` (built at ``key``'s shape when a key is given); returns [n, 80, F]."""
        replay = None if key is None else self.dispatcher.replayer(key)
        if replay is None:
            return self.est.solve(s)
        self._load(key, s)  # type: ignore[arg-type]
        return replay()

    def _views(self, key: GraphKey) -> SolveInputs:
        b, f = key.batch, key.frames
        return SolveInputs(
            0,
            b,
            self.x[:b, :, :f],
            self.mu[:b, :, :f],
            self.spk[:b],
            self.cond[:b, :, :f],
            self.write[: 2 * b, :f],
            self.mask[: 2 * b],
            self.last[: 2 * b],
            self.active[: 2 * b],
        )

    def _load(self, key: GraphKey, s: SolveInputs) -> None:
        v = self._views(key)
        for dst, src in (
            (v.x, s.x),
            (v.mu, s.mu),
            (v.spk, s.spk),
            (v.cond, s.cond),
            (v.write_pos, s.write_pos),
            (v.key_mask, s.key_mask),
            (v.last_idx, s.last_idx),
            (v.active, s.active),
        ):
            dst.copy_(src, non_blocking=True)

    def _body(self, key: GraphKey) -> torch.Tensor:
        out = self.out[: key.batch, :, : key.frames]
        out.copy_(self.est.solve(self._views(key)))
        return out

    def _idle(self) -> None:
        """Every row inactive: writes go to the trash frame, which is all a row attends to."""
        for t in (self.x, self.mu, self.cond, self.spk, self.last, self.active, self.mask):
            t.zero_()
        self.write.fill_(self.trash)
        self.mask[..., self.trash] = True


def _mod(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def _interleave(a: torch.Tensor) -> torch.Tensor:
    """[n, ...] -> [2n, ...] as (row, zeros) pairs: the conditional and unconditional rows."""
    return torch.stack([a, torch.zeros_like(a)], dim=1).flatten(0, 1)


def _last_two(y: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """y: [R, C, 2 + F] (2 cache frames first); the 2 frames before each row's end -> [R, C, 2]."""
    idx = n[:, None] + torch.arange(2, device=y.device)  # positions n, n+1 in cache-prefixed time
    return y.gather(2, idx[:, None, :].expand(-1, y.shape[1], -1))
