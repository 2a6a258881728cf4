"""The flow's token encoder (``UpsampleConformerEncoderV2.forward_chunk``) for many streams at once.

Called one stream at a time the encoder costs a few hundred launches per stream for ~1 ms of
device work, so this runs every module once over a padded batch, with per row the reference's
arithmetic and weights:

* Each row's new frames are left-aligned. The causal convs then read the row's conv cache (put
  in front by one ``cat``) and its own frames only; the lookahead conv reads only the row's own
  frames and, for a last chunk, the reference's zero pad. Padded frames feed no valid output.
* Each row's keys are ``[history | new]``, each part left-aligned in its padded block. The
  relative-position term is gathered per (row, query, key) from the same ESPnet table by the
  true distance (query position - key position), which is what the reference's ``rel_shift``
  yields for a single row; padded keys are masked before the softmax.
* The attention caches live in a preallocated slab in the reference's packed layout (first-block
  caches doubled along time, then cut to prompt + 100). A row's next cache is one gather from
  this call's keys by an index that mirrors the reference's ``repeat``/``cat``/cut, so its quirks
  (e.g. the first blocks' history freezing once the cut starts) are reproduced, not re-derived.

All raggedness is in small host-built index tensors (a few host-to-device copies per call, no
device sync), so the number of launches per call depends on the depth, not on the number of
streams; the slab's size is fixed (``max_streams`` x depth x (max prompt + 100) x 2 x width).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import HISTORY_FRAMES
from .transfer import to_device

LOOKAHEAD_CACHE = 2  # the reference's lookahead-conv cache (its second conv's kernel - 1)
# The most one attention-score tensor of a call may take. A call's temporaries are one layer's
# keys and a few score tensors; above this, its rows run in several calls. Decode chunks fit
# in one call up to about 140 rows; a burst of long prompts' set-ups splits (see workspace.py).
SCORES_BYTES = 160 << 20


@dataclass(slots=True, weakref_slot=True)
class EncoderCache:
    """One stream's encoder state: its slab slot and the packed attention-cache length.

    ``short_lookahead`` marks a chunk of fewer than two frames: the reference then keeps a
    shorter lookahead cache, which its next call rejects, so this one does too.
    """

    slot: int
    length: int = 0  # along time, as the reference's att_cache.shape[3]
    short_lookahead: bool = False


@dataclass(slots=True)
class EncoderState:
    """A copy of one stream's encoder caches (packed attention, conv) and their lengths."""

    att: torch.Tensor  # [depth, length, heads * 2 * d_k]
    cnn: torch.Tensor  # [width, lookahead + up-sampling cache]
    length: int
    short_lookahead: bool


@dataclass(slots=True)
class _Plan:
    """Host-side sizes of one call."""

    frames: int  # padded new frames of the first blocks (N1); the up blocks see 2 * N1
    hist1: int  # padded history of the first blocks
    hist2: int  # padded history of the up blocks
    new_frames: list[int]  # per row, first blocks
    new_length: list[int]  # per row, packed cache length after the cut


class BatchedEncoder:
    """The encoder of ``flow`` over ragged batches; caches in a slab of ``max_streams`` slots."""

    def __init__(
        self,
        flow: nn.Module,
        device: torch.device,
        max_streams: int,
        max_prompt_frames: int,
    ) -> None:
        # the reference's submodules, duck-typed: their attributes are not visible to typing
        enc: Any = flow.encoder
        self.flow: Any = flow
        self.enc, self.device = enc, torch.device(device)
        self.blocks1, self.blocks2 = list(enc.encoders), list(enc.up_encoders)
        for layer in self.blocks1 + self.blocks2:
            # the layer arithmetic below is that of this configuration only
            if (
                layer.feed_forward_macaron is not None
                or layer.conv_module is not None
                or not layer.normalize_before
            ):
                raise ValueError("unsupported conformer layer configuration")
        if not enc.normalize_before:
            raise ValueError("unsupported encoder configuration")
        up = enc.up_layer
        if float(up.scale_factor) != float(up.stride):
            raise ValueError("up-sampling factor must equal its stride")
        attn = self.blocks1[0].self_attn
        self.heads, self.dk = int(attn.h), int(attn.d_k)
        self.width = int(enc.output_size())
        self.lookahead = int(enc.pre_lookahead_layer.pre_lookahead_len)
        self.stride = int(up.stride)
        self.up_cache = 2 * self.stride
        self.depth = len(self.blocks1) + len(self.blocks2)
        self.capacity = max_prompt_frames + HISTORY_FRAMES  # a cut cache never exceeds this
        self.max_prompt_frames = max_prompt_frames
        dtype = next(enc.parameters()).dtype
        feat = self.heads * 2 * self.dk
        # zero-filled so a padded key or value is always finite (0 * NaN would leak); normal
        # tensors even if built under inference mode, as new_cache writes them outside it
        with torch.inference_mode(False):
            self.att = torch.zeros(
                max_streams, self.depth, self.capacity, feat, dtype=dtype, device=self.device
            )
            self.cnn = torch.zeros(
                max_streams,
                self.width,
                LOOKAHEAD_CACHE + self.up_cache,
                dtype=dtype,
                device=self.device,
            )
        self._free = list(range(max_streams - 1, -1, -1))
        self._release: dict[int, weakref.finalize[Any, Any]] = {}

    # slots
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def new_cache(self) -> EncoderCache:
        """A fresh stream's state (as the reference's ``None`` caches); its slot is freed by
        :meth:`release` or when the cache object is dropped."""
        if not self._free:
            raise RuntimeError("no free encoder slot")
        slot = self._free.pop()
        self.cnn[slot].zero_()
        cache = EncoderCache(slot)
        self._release[slot] = weakref.finalize(cache, self._free.append, slot)
        return cache

    def scrub(self, cache: EncoderCache) -> None:
        """Zero the stream's attention cache in the slab (see :meth:`Runner.scrub`); its conv
        cache is zeroed by :meth:`new_cache` when the slot is taken again."""
        self.att[cache.slot].zero_()

    def release(self, cache: EncoderCache) -> None:
        fin = self._release.pop(cache.slot, None)
        if fin is not None:
            fin()
        cache.slot = -1

    def reference_caches(self, cache: EncoderCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream's caches in the reference's layout (views of the slab):
        cnn [1, C, 6], att [depth, 1, H, T, 2dk]."""
        cnn = self.cnn[cache.slot]
        if cache.short_lookahead:
            cnn = cnn[:, 1:]
        att = self.att[cache.slot, :, : cache.length]
        att = att.view(self.depth, cache.length, self.heads, 2 * self.dk).transpose(1, 2)
        return cnn.unsqueeze(0), att.unsqueeze(1)

    def export_state(self, cache: EncoderCache, copy: bool = True) -> EncoderState:
        """The stream's caches, to start another stream of the same voice from: a copy, or
        (``copy=False``) views of its slot, valid until the slot next changes."""
        att, cnn = self.att[cache.slot, :, : cache.length], self.cnn[cache.slot]
        if copy:
            att, cnn = att.clone(), cnn.clone()
        return EncoderState(att, cnn, cache.length, cache.short_lookahead)

    def import_state(self, cache: EncoderCache, state: EncoderState) -> None:
        """Put ``state`` (from :meth:`export_state`) into the slot of ``cache``."""
        self.att[cache.slot, :, : state.length].copy_(state.att)
        self.cnn[cache.slot].copy_(state.cnn)
        cache.length, cache.short_lookahead = state.length, state.short_lookahead

    # the forward
    @torch.inference_mode()
    def encode(
        self,
        caches: Sequence[EncoderCache],
        tokens: Sequence[torch.Tensor | Sequence[int]],
        last: Sequence[bool],
        prompt_frames: Sequence[int],
    ) -> list[torch.Tensor]:
        """One ``forward_chunk`` per stream, in one batched forward; mu [80, frames] per stream.

        ``tokens[i]`` holds a chunk's tokens with its lookahead (a prompt: its tokens plus the
        pad tokens); caches are updated in place and cut to ``prompt_frames[i]`` + 100.
        """
        b = len(caches)
        if not b or not len(tokens) == len(last) == len(prompt_frames) == b:
            raise ValueError("one token chunk, last flag and prompt length per cache")
        rows = self.rows_per_call(caches, tokens)
        if b <= rows:
            return self._encode(caches, tokens, last, prompt_frames)
        out: list[torch.Tensor] = []
        for i in range(0, b, rows):
            part = slice(i, i + rows)
            out += self._encode(caches[part], tokens[part], last[part], prompt_frames[part])
        return out

    def rows_per_call(
        self, caches: Sequence[EncoderCache], tokens: Sequence[torch.Tensor | Sequence[int]]
    ) -> int:
        """How many of these rows one call takes within :data:`SCORES_BYTES`: an up block's
        scores are heads x queries x keys per row, the largest of the call's tensors."""
        queries = self.stride * max(
            t.numel() if isinstance(t, torch.Tensor) else len(t) for t in tokens
        )
        keys = max(c.length for c in caches) + queries
        per_row = self.heads * queries * keys * self.att.element_size()
        return max(1, SCORES_BYTES // per_row)

    def _encode(
        self,
        caches: Sequence[EncoderCache],
        tokens: Sequence[torch.Tensor | Sequence[int]],
        last: Sequence[bool],
        prompt_frames: Sequence[int],
    ) -> list[torch.Tensor]:
        b = len(caches)
        flat, counts = self._flat_tokens(tokens)
        plan, ints, flags = self._plan(caches, counts, last, prompt_frames)
        dev = self.device
        ints_d, flags_d = to_device(ints, dev), to_device(flags, dev)
        n1, h1, h2 = plan.frames, plan.hist1, plan.hist2
        n2 = self.stride * n1
        e = n1 + self.lookahead
        d1 = len(self.blocks1)
        t1, t2 = h1 + n1, h2 + n2
        ii = _Unpack(ints_d)
        slots = ii.take(b)
        look_idx = ii.take(b * LOOKAHEAD_CACHE).view(b, 1, LOOKAHEAD_CACHE)
        up_idx = ii.take(b * self.up_cache).view(b, 1, self.up_cache)
        shift1, base1 = ii.take(b * t1).view(b, 1, t1), ii.take(n1 * t1).view(n1, t1)
        shift2, base2 = ii.take(b * t2).view(b, 1, t2), ii.take(n2 * t2).view(n2, t2)
        keep1, keep2 = ii.take(b * self.capacity), ii.take(b * self.capacity)
        tok_idx = ii.take(b * e).view(b, e)
        ff = _Unpack(flags_d)
        tok_pad = ff.take(b * e).view(b, e, 1)
        pad1 = ff.take(b * t1).view(b, 1, 1, t1)
        pad2 = ff.take(b * t2).view(b, 1, 1, t2)

        cnn = self.cnn.index_select(0, slots)

        # token embedding, lookahead conv (the reference zero-pads a last chunk after embed)
        tok = to_device(flat, dev)[tok_idx]
        xs = self.enc.embed(self.flow.input_embedding(tok), None)[0]
        xs = xs.masked_fill(tok_pad, 0.0)
        pl = self.enc.pre_lookahead_layer
        y = F.leaky_relu(pl.conv1(xs.transpose(1, 2).contiguous()))
        y = torch.cat([cnn[:, :, :LOOKAHEAD_CACHE], y], dim=2)
        new_look = torch.gather(y, 2, look_idx.expand(b, self.width, LOOKAHEAD_CACHE))
        x = pl.conv2(y).transpose(1, 2).contiguous() + xs[:, :n1]

        # first blocks
        pe = self.enc.embed.position_encoding(offset=None, size=t1)
        rel = (base1 + shift1).unsqueeze(1)  # [B, 1, N1, T1]
        for i, layer in enumerate(self.blocks1):
            x = self._cached_layer(layer, i, x, slots, h1, keep1, pe, rel, pad1)

        # up-sampling conv, up embedding
        up = self.enc.up_layer
        y = F.interpolate(x.transpose(1, 2).contiguous(), scale_factor=up.scale_factor)
        y = torch.cat([cnn[:, :, LOOKAHEAD_CACHE:], y], dim=2)
        new_up = torch.gather(y, 2, up_idx.expand(b, self.width, self.up_cache))
        x = self.enc.up_embed(up.conv(y).transpose(1, 2).contiguous(), None)[0]

        # up blocks
        pe = self.enc.embed.position_encoding(offset=None, size=t2)
        rel = (base2 + shift2).unsqueeze(1)
        for i, layer in enumerate(self.blocks2):
            x = self._cached_layer(layer, d1 + i, x, slots, h2, keep2, pe, rel, pad2)
        mu = self.flow.encoder_proj(self.enc.after_norm(x))  # [B, N2, 80]
        self.cnn.index_copy_(0, slots, torch.cat([new_look, new_up], dim=2))
        for c, n, length in zip(caches, plan.new_frames, plan.new_length, strict=True):
            c.length = length
            c.short_lookahead = n < LOOKAHEAD_CACHE
        return [mu[i, : self.stride * n].transpose(0, 1) for i, n in enumerate(plan.new_frames)]

    def _cached_layer(
        self,
        layer: Any,
        depth: int,
        x: torch.Tensor,
        slots: torch.Tensor,
        hist_len: int,
        keep: torch.Tensor,
        pe: torch.Tensor,
        rel: torch.Tensor,
        pad: torch.Tensor,
    ) -> torch.Tensor:
        """One layer over its cached keys, whose cache then takes the reference's packed, cut
        layout from this call's keys. Layer by layer, so a call holds one layer's keys: read
        before they are written, and no other layer reads them."""
        b, feat = x.shape[0], self.heads * 2 * self.dk
        hist = self.att[:, depth, :hist_len].index_select(0, slots)  # [B, h, F]
        keys = rel.shape[-1]  # history and this call's frames
        kv = torch.empty(b, keys, self.heads, 2 * self.dk, dtype=self.att.dtype, device=x.device)
        x = self._layer(layer, x, hist.view(b, hist_len, self.heads, 2 * self.dk), kv, pe, rel,
                        pad)
        kept = kv.view(-1, feat).index_select(0, keep).view(b, self.capacity, feat)
        self.att[:, depth].index_copy_(0, slots, kept)
        return x

    def _layer(
        self,
        layer: Any,
        x: torch.Tensor,
        hist: torch.Tensor,
        kv: torch.Tensor,
        pe: torch.Tensor,
        rel: torch.Tensor,
        pad: torch.Tensor,
    ) -> torch.Tensor:
        """One conformer layer (pre-norm attention + feed-forward); writes [history | new]
        keys and values of every row into ``kv`` [B, T, H, 2dk]."""
        att = layer.self_attn
        b, n, _ = x.shape
        h, dk, t = self.heads, self.dk, kv.shape[1]
        res = x
        x = layer.norm_mha(x)
        q = att.linear_q(x).view(b, n, h, dk)
        k = att.linear_k(x).view(b, n, h, dk)
        v = att.linear_v(x).view(b, n, h, dk)
        torch.cat([hist, torch.cat([k, v], dim=-1)], dim=1, out=kv)
        keys, values = kv[..., :dk].transpose(1, 2), kv[..., dk:].transpose(1, 2)
        ac = torch.matmul((q + att.pos_bias_u).transpose(1, 2), keys.transpose(-2, -1))
        # one product per head over all rows' queries: the table is shared by every row, and a
        # batched matmul would copy it once per row
        p = att.linear_pos(pe).view(-1, h, dk).permute(1, 2, 0)  # [H, dk, 2T - 1]
        qv = (q + att.pos_bias_v).permute(2, 0, 1, 3).reshape(h, b * n, dk)
        bd = torch.bmm(qv, p).view(h, b, n, -1).transpose(0, 1)  # [B, H, N, 2T - 1]
        bd = torch.gather(bd, 3, rel.expand(b, h, n, t))
        scores = ((ac + bd) / math.sqrt(dk)).masked_fill(pad, -math.inf)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), values)
        x = res + att.linear_out(ctx.transpose(1, 2).contiguous().view(b, n, h * dk))
        out: torch.Tensor = x + layer.feed_forward(layer.norm_ff(x))
        return out

    # host-side plan
    def _flat_tokens(
        self, tokens: Sequence[torch.Tensor | Sequence[int]]
    ) -> tuple[torch.Tensor, list[int]]:
        """All rows' tokens in one flat tensor: on the host if all are, else on the device."""
        rows = [
            t.reshape(-1)
            if isinstance(t, torch.Tensor)
            else torch.tensor(list(t), dtype=torch.long)
            for t in tokens
        ]
        if any(r.device != torch.device("cpu") for r in rows):
            rows = [r.to(self.device) for r in rows]
        dtype = torch.promote_types(rows[0].dtype, torch.int32)
        return torch.cat([r.to(dtype) for r in rows]), [int(r.numel()) for r in rows]

    def _plan(
        self,
        caches: Sequence[EncoderCache],
        counts: list[int],
        last: Sequence[bool],
        prompt_frames: Sequence[int],
    ) -> tuple[_Plan, torch.Tensor, torch.Tensor]:
        """Sizes and every index of one call, as one int64 and one bool host tensor."""
        b, la, cap = len(caches), self.lookahead, self.capacity
        slots = [c.slot for c in caches]
        if min(slots) < 0 or len(set(slots)) != b:
            raise ValueError("each cache must hold its own live slot")
        if any(c.short_lookahead for c in caches):
            raise ValueError("a stream cannot continue after a chunk of fewer than 2 frames")
        if max(prompt_frames) > self.max_prompt_frames:
            raise ValueError("prompt longer than this encoder's max_prompt_frames")
        lengths = [c.length for c in caches]
        if any(x % 2 for x in lengths):
            raise ValueError("odd attention-cache length")
        new = [m + la * bool(z) - la for m, z in zip(counts, last, strict=True)]
        if min(new) < 1:
            raise ValueError("a chunk must yield at least one frame")

        long = torch.long
        m = torch.tensor(counts, dtype=long)
        n = torch.tensor(new, dtype=long)
        length = torch.tensor(lengths, dtype=long)
        prompt = torch.tensor(list(prompt_frames), dtype=long)
        n1, e = max(new), max(new) + la
        n2 = self.stride * n1
        h1v, h2v = length // 2, length
        h1, h2 = int(h1v.max()), int(h2v.max())
        t1, t2 = h1 + n1, h2 + n2
        rows = torch.arange(b, dtype=long)[:, None]

        # tokens: row-major, left-aligned; pad positions read any token and are zeroed after embed
        pos = torch.arange(e, dtype=long)[None]
        start = (torch.cumsum(m, 0) - m)[:, None]
        tok_idx = torch.where(pos < m[:, None], start + pos, 0)
        tok_pad = pos >= m[:, None]

        # conv caches: the last 2 lookahead-conv outputs and the last 4 up-sampled inputs
        look = n[:, None] + torch.arange(LOOKAHEAD_CACHE, dtype=long)
        upc = self.stride * n[:, None] + torch.arange(self.up_cache, dtype=long)

        shift1, base1, pad1 = _key_layout(h1v, h1, n1, n)
        shift2, base2, pad2 = _key_layout(h2v, h2, n2, self.stride * n)

        # the reference's packed cut: [first-block keys twice | up-block keys], keep the first
        # `prompt` and the last 100 positions once longer than prompt + 100
        full = 2 * (h1v + n)  # == h2v + 2n, the packed length before the cut
        cut = full > prompt + HISTORY_FRAMES
        new_length = torch.where(cut, prompt + HISTORY_FRAMES, full)
        if int(new_length.max()) > cap:
            raise ValueError("attention cache longer than this encoder's capacity")
        q = torch.arange(cap, dtype=long)[None]
        src = torch.where(
            cut[:, None] & (q >= prompt[:, None]),
            full[:, None] - HISTORY_FRAMES + q - prompt[:, None],
            q,
        )
        live = q < new_length[:, None]
        src1 = src % (h1v + n)[:, None]  # the doubled first-block keys
        keep1 = torch.where(src1 < h1v[:, None], src1, h1 + src1 - h1v[:, None])
        keep2 = torch.where(src < h2v[:, None], src, h2 + src - h2v[:, None])
        keep1 = torch.where(live, keep1, 0) + rows * t1
        keep2 = torch.where(live, keep2, 0) + rows * t2

        ints = torch.cat(
            [
                torch.tensor(slots, dtype=long),
                look.reshape(-1),
                upc.reshape(-1),
                shift1.reshape(-1),
                base1.reshape(-1),
                shift2.reshape(-1),
                base2.reshape(-1),
                keep1.reshape(-1),
                keep2.reshape(-1),
                tok_idx.reshape(-1),
            ]
        )
        flags = torch.cat([tok_pad.reshape(-1), pad1.reshape(-1), pad2.reshape(-1)])
        plan = _Plan(n1, h1, h2, new, new_length.tolist())
        return plan, ints, flags


def _key_layout(
    hv: torch.Tensor, hmax: int, nq: int, nv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Key ``j`` of a row is history ``j`` (< h) or new ``j - hmax``; query ``i`` sits at
    ``h + i``. The ESPnet table (2T - 1 rows) holds distance d at row T - 1 - d, so a score's
    row is ``base[i, j] + shift[row, j]``; ``pad`` marks keys that are not the row's."""
    j = torch.arange(hmax + nq, dtype=torch.long)[None]
    hist = j < hmax
    shift = torch.where(hist, -hv[:, None], -hmax)
    pad = torch.where(hist, j >= hv[:, None], j - hmax >= nv[:, None])
    base = (hmax + nq - 1) - torch.arange(nq, dtype=torch.long)[:, None] + j
    return shift, base, pad


class _Unpack:
    """Consecutive views of one flat tensor."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat, self.at = flat, 0

    def take(self, size: int) -> torch.Tensor:
        out = self.flat[self.at : self.at + size]
        self.at += size
        return out
