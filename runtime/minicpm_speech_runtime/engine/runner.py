"""Owns every device buffer: the estimator's key/value pool and frame table, per-stream
encoder and vocoder caches, the static graph buffers and the graph dispatcher.

A new stream takes the lowest free slot and, from the pool, the frames its own prompt needs
(:class:`~.frame_pool.FramePool`); its slot's two rows of the frame table point at them, every
other position at the row's own trash frame. It keeps the slot while the slots in use fit the
smallest decode graph that holds that many streams. Only when the highest slot in use is past
that graph size is it moved into the lowest free slot, so a shrinking load still runs the
smaller graphs; a move rewrites two table rows and copies the slot's conv caches, never keys.
A decode solve covers slots ``[0, batch)`` of the smallest graph that holds every stream in it;
free slots and streams without a ready chunk are inactive rows there.
A setup group's prompts are packed end to end in a scratch estimator of one row pair
(:mod:`.setup_solve`), and each prompt's caches are then copied to its stream's frames.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from minicpm_speech_contract.extras import kv_frame_bytes

from ..assets import Code2WavModels
from .config import (
    CHUNK_TOKENS,
    LOOKAHEAD_TOKENS,
    PROMPT_PAD_TOKEN,
    EngineConfig,
)
from .encoder import BatchedEncoder, EncoderCache, EncoderState
from .estimator import BatchedEstimator, GraphedSolve, SolveInputs
from .frame_pool import FramePool
from .graphs import CaptureBackend, CudaGraphBackend, GraphDispatcher, batch_grid
from .kernels import Kernels
from .setup_cache import SetupCache, VoiceSetup
from .setup_solve import PackedSetupSolve
from .state import Chunk, FrameMap, StreamState
from .transfer import to_device
from .vocoder import BatchedVocoder, VocoderCache

if TYPE_CHECKING:
    from .estimator import CausalMaskedDiffWithXvec

# a solve's rows: (slot in the solve's estimator, speaker [80], new positions, valid positions)
Row = tuple[int, torch.Tensor, list[int], list[int]]


@dataclass(slots=True)
class DeviceStream:
    """Device-side state of one stream besides its estimator slot."""

    spk: torch.Tensor  # [80] projected speaker embedding
    prompt_frames: int
    frames: FrameMap
    pool_frames: list[int]  # its frames of the key/value pool: row 2 * slot's, then the other's
    vocoder: VocoderCache
    encoder: EncoderCache  # a slot of the batched encoder's cache slab


MelTap = Callable[[list[object], list[torch.Tensor], list[torch.Tensor]], None]


class Runner:
    def __init__(
        self,
        models: Code2WavModels,
        config: EngineConfig,
        graph_backend: CaptureBackend | None = None,
    ) -> None:
        self.flow = cast("CausalMaskedDiffWithXvec", models.flow)
        self.device, self.config = models.device, config
        self.trash = config.cache_frames - 1
        steps = config.n_timesteps
        self.kernels = Kernels.for_device(models.device, config.fused_kernels)
        cache_dtype = torch.bfloat16 if config.precision == "bf16-cache" else None
        # what the encoder and the DiT compute with; the speaker projection stays the flow's
        self.compute_flow = compute_flow(self.flow, config.precision)
        # frames [0, 2 * max_streams) are the rows' own trash frames, the rest the streams'
        rows = 2 * config.max_streams
        per_frame = kv_frame_nbytes(self.compute_flow, config)
        self.pool = FramePool(rows, kv_pool_frames(config, per_frame))
        self.estimator = BatchedEstimator(
            self.compute_flow.decoder, config.max_streams, config.cache_frames, steps,
            self.kernels,
            cache_dtype=cache_dtype,
            pool_frames=rows + self.pool.capacity,
        )
        self.table = torch.arange(rows)[:, None].repeat(1, config.cache_frames)  # host copy
        self.estimator.table.copy_(self.table)
        self.setup_estimator = BatchedEstimator(
            self.compute_flow.decoder,
            1,
            config.setup_cache_frames,
            steps,
            self.kernels,
            conv_slots=config.micro_batch,
            cache_dtype=cache_dtype,
        )
        if graph_backend is None and config.cuda_graphs and models.device.type == "cuda":
            graph_backend = CudaGraphBackend(models.device)
        self.graphs = GraphDispatcher(config.graph_budget, graph_backend)
        self.decode_sizes = decode_sizes = batch_grid(config.max_streams)
        self.decode_solve = GraphedSolve(
            self.estimator,
            self.graphs,
            "decode",
            decode_sizes,
            [2 * CHUNK_TOKENS, config.max_chunk_frames],
        )
        self.setup_solve = PackedSetupSolve(
            self.setup_estimator, self.graphs, config.setup_frame_buckets, config.micro_batch
        )
        self.encoder = BatchedEncoder(
            self.compute_flow, models.device, config.max_streams, config.max_prompt_frames
        )
        hift_sizes = decode_sizes if config.vocoder_graphs else None
        self.vocoder = BatchedVocoder(
            models.hift, models.device, self.graphs, hift_sizes, self.kernels,
            tf32=config.tf32 and config.vocoder_tf32, bounded_convs=config.bounded_convs,
        )
        self.setup_cache = SetupCache(config.setup_cache_mib * 2**20, config.setup_cache_voices)
        self.owner: list[StreamState | None] = [None] * config.max_streams
        self.streams: dict[object, DeviceStream] = {}
        self.slot_moves = 0
        self.profile = False  # when set, phases are timed with a device sync around each
        # when set, called with each decode's stream ids, the flow's mels [80, frames] for them
        # and the noise each solve started from, before the vocoder (the fidelity bench)
        self.mel_tap: MelTap | None = None
        # seconds by phase; a Counter, so a phase starts at 0
        self.phase_s = cast("dict[str, float]", Counter())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named part of a step: a range in a torch profiler's trace, and with ``profile`` set
        also timed between device syncs into ``phase_s``."""
        if not self.profile:
            with torch.profiler.record_function(name):
                yield
            return
        _sync(self.device)
        t0 = time.perf_counter()
        yield
        _sync(self.device)
        self.phase_s[name] += time.perf_counter() - t0

    # slots
    @property
    def num_live(self) -> int:
        return len(self.streams)

    def admits(self, prompt_frames: int) -> bool:
        """Whether a stream of this prompt can start now: a free slot and its frames."""
        need = 2 * self.config.stream_frames(prompt_frames)
        return self.num_live < self.config.max_streams and self.pool.available >= need

    def attach(self, s: StreamState) -> None:
        if self.num_live >= self.config.max_streams:
            raise RuntimeError("no free stream slot")
        positions = self.config.stream_frames(s.prompt_frames)
        if self.pool.available < 2 * positions:
            raise RuntimeError(
                f"no free cache frames: a {s.prompt_frames}-frame prompt needs "
                f"{2 * positions}, {self.pool.available} are free until a stream ends"
            )
        s.slot = self.owner.index(None)
        self.owner[s.slot] = s
        spk = self.flow.spk_embed_affine_layer(F.normalize(s.voice.spk_emb, dim=1))
        frames = self.pool.take(2 * positions)
        self.streams[s.stream_id] = DeviceStream(
            spk[0],
            s.prompt_frames,
            FrameMap(s.prompt_frames, positions),
            frames,
            VocoderCache.empty(self.device),
            self.encoder.new_cache(),
        )
        self._map(s.slot, frames)

    def detach(self, s: StreamState) -> None:
        d = self.streams.pop(s.stream_id)
        self.encoder.release(d.encoder)
        self.pool.give(d.pool_frames)
        self._map(s.slot, None)
        self.owner[s.slot] = None
        s.slot = -1
        fits = min(n for n in self.decode_sizes if n >= max(self.num_live, 1))
        while (top := self._highest_slot()) >= fits:
            self._move(top, self.owner.index(None))

    def scrub(self, s: StreamState) -> None:
        """Zero the stream's keys, values (its trash frames too), conv and encoder caches: a
        masked key or value is multiplied by 0, and 0 * NaN would carry a failed stream's NaN
        into the next stream given those frames."""
        est, rows = self.estimator, [2 * s.slot, 2 * s.slot + 1]
        frames = to_device(torch.tensor(self.streams[s.stream_id].pool_frames + rows), self.device)
        for buf in (est.k, est.v):
            buf.index_fill_(2, frames, 0)
        est.conv[:, :, rows[0] : rows[1] + 1].zero_()
        self.encoder.scrub(self.streams[s.stream_id].encoder)

    def _map(self, slot: int, frames: list[int] | None) -> None:
        """Point the slot's two table rows at ``frames`` (half each, from position 0), every
        other position at the row's trash frame; ``None``: the trash frame only."""
        rows = self.table[2 * slot : 2 * slot + 2]
        rows[0], rows[1] = 2 * slot, 2 * slot + 1
        if frames is not None:
            half = len(frames) // 2
            rows[:, :half] = torch.tensor(frames).view(2, half)
        self.estimator.table[2 * slot : 2 * slot + 2].copy_(to_device(rows, self.device))

    def _highest_slot(self) -> int:
        return max((i for i, o in enumerate(self.owner) if o is not None), default=-1)

    def _move(self, src: int, dst: int) -> None:
        moved = self.owner[src]
        assert moved is not None
        conv = self.estimator.conv
        conv[:, :, 2 * dst : 2 * dst + 2].copy_(conv[:, :, 2 * src : 2 * src + 2])
        self._map(dst, self.streams[moved.stream_id].pool_frames)
        self._map(src, None)
        self.owner[dst], self.owner[src] = moved, None
        moved.slot = dst
        self.slot_moves += 1

    def prompt_frames_of(self, s: StreamState) -> torch.Tensor:
        """The pool frames of the stream's prompt positions, both rows: [2 * prompt] (device)."""
        d, p = self.streams[s.stream_id], s.prompt_frames
        half = len(d.pool_frames) // 2
        frames = d.pool_frames[:p] + d.pool_frames[half : half + p]
        return to_device(torch.tensor(frames), self.device)

    def prompt_kv(self, s: StreamState) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream's prompt keys and values as [steps, depth, 2 rows, heads, prompt, head_dim]
        (copies), the layout of the reference's estimator cache."""
        frames, p = self.prompt_frames_of(s), s.prompt_frames
        est = self.estimator

        def rows(pool: torch.Tensor) -> torch.Tensor:
            t = pool.index_select(2, frames)  # [steps, depth, 2p, H, D]
            return t.view(est.steps, est.depth, 2, p, est.heads, est.head_dim).transpose(3, 4)

        return rows(est.k), rows(est.v)

    # cold setup
    @torch.inference_mode()
    def setup(self, groups: list[list[StreamState]]) -> None:
        """The reference's ``setup_cache`` for groups of new streams: one encoder pass for all
        of them, then one packed solve per group."""
        every = [s for group in groups for s in group]
        with self.phase("setup_encode"):
            mus = self._encode(every, [self._prompt_tokens(s) for s in every], [False] * len(every))
        mu_of = {id(s): mu for s, mu in zip(every, mus, strict=True)}
        for group in groups:
            ds = [self.streams[s.stream_id] for s in group]
            for d in ds:
                d.frames.setup()
            with self.phase("setup_solve"):
                layout, key = self.setup_solve.layout([d.prompt_frames for d in ds])
                self.setup_solve.run(
                    layout,
                    key,
                    [mu_of[id(s)] for s in group],
                    [s.voice.prompt_mels[0].transpose(0, 1) for s in group],  # [80, P]
                    [d.spk for d in ds],
                )
                for j, (s, start) in enumerate(zip(group, layout.starts, strict=True)):
                    self._adopt(j, start, s)
            if self.setup_cache.enabled:
                for s in group:
                    self.setup_cache.put(s.voice_key, self._snapshot(s))

    @torch.inference_mode()
    def setup_from_cache(self, s: StreamState) -> None:
        """A stream of a voice the setup cache holds starts from a copy: no solve."""
        entry = self.setup_cache.get(s.voice_key)
        if entry is None:
            raise KeyError(f"voice {s.voice_key!r} is not in the setup cache")
        self._restore(s, entry)

    @torch.inference_mode()
    def copy_setup(self, leader: StreamState, s: StreamState) -> None:
        """A stream of the same voice as ``leader``, set up in this step, starts from its copy
        (frame to frame: the leader's caches are read in place)."""
        pools = (self.estimator.k, self.estimator.v)
        src, dst = self.prompt_frames_of(leader), self.prompt_frames_of(s)
        for pool in pools:
            _copy_frames(pool, src, pool, dst)
        lead = self.streams[leader.stream_id].encoder
        self._started(s, self._conv_rows(leader), self.encoder.export_state(lead, copy=False))

    def _snapshot(self, s: StreamState) -> VoiceSetup:
        """A copy of the stream's set-up caches."""
        frames = self.prompt_frames_of(s)
        k, v = (t.index_select(2, frames) for t in (self.estimator.k, self.estimator.v))
        encoder = self.encoder.export_state(self.streams[s.stream_id].encoder, copy=True)
        return VoiceSetup(k, v, self._conv_rows(s).clone(), encoder)

    def _restore(self, s: StreamState, entry: VoiceSetup) -> None:
        frames = self.prompt_frames_of(s)
        for pool, src in ((self.estimator.k, entry.k), (self.estimator.v, entry.v)):
            for step in range(pool.shape[0]):  # staging-free: the entry's frames go in place
                pool[step].index_copy_(1, frames, src[step])
        self._started(s, entry.conv, entry.encoder)

    def _conv_rows(self, s: StreamState) -> torch.Tensor:
        return self.estimator.conv[:, :, 2 * s.slot : 2 * s.slot + 2]

    def _started(self, s: StreamState, conv: torch.Tensor, encoder: EncoderState) -> None:
        """The rest of a copied set-up: conv rows, the encoder's caches, the frame map."""
        self._conv_rows(s).copy_(conv)
        d = self.streams[s.stream_id]
        d.frames.setup()
        self.encoder.import_state(d.encoder, encoder)

    def _adopt(self, j: int, start: int, s: StreamState) -> None:
        """Copy the ``j``-th prompt of a packed setup (keys and values at ``start``, conv
        caches in conv rows ``2j, 2j + 1``) into the stream's frames and conv rows."""
        a, b, p, dst = self.setup_estimator, self.estimator, s.prompt_frames, s.slot
        src = a.table[0:2, start : start + p].reshape(-1)
        frames = self.prompt_frames_of(s)
        for sbuf, dbuf in ((a.k, b.k), (a.v, b.v)):
            _copy_frames(sbuf, src, dbuf, frames)
        b.conv[:, :, 2 * dst : 2 * dst + 2].copy_(a.conv[:, :, 2 * j : 2 * j + 2])

    @staticmethod
    def _prompt_tokens(s: StreamState) -> torch.Tensor:
        """The prompt's tokens and the reference's pad for its lookahead."""
        tok = s.voice.prompt_tokens[0]
        pad = torch.full((LOOKAHEAD_TOKENS,), PROMPT_PAD_TOKEN, dtype=tok.dtype, device=tok.device)
        return torch.cat([tok, pad])

    def _encode(
        self, streams: list[StreamState], tokens: list[torch.Tensor], last: list[bool]
    ) -> list[torch.Tensor]:
        """Encoder ``forward_chunk`` for every stream in one batched pass; mu [80, frames] each."""
        ds = [self.streams[s.stream_id] for s in streams]
        return self.encoder.encode(
            [d.encoder for d in ds], tokens, last, [d.prompt_frames for d in ds]
        )

    # decode
    @torch.inference_mode()
    def decode(self, batch: list[tuple[StreamState, Chunk]]) -> list[torch.Tensor]:
        """One chunk for each stream: encoder, one batched solve, one vocoder pass per length."""
        offsets, rows = [], []
        with self.phase("decode_encode"):
            streams = [s for s, _ in batch]
            tokens = [torch.tensor(c.tokens, dtype=torch.int32) for _, c in batch]
            mus = self._encode(streams, tokens, [c.last for _, c in batch])
            for s, mu in zip(streams, mus, strict=True):
                fm = self.streams[s.stream_id].frames
                offsets.append(fm.length)
                spk = self.streams[s.stream_id].spk
                rows.append((s.slot, spk, fm.append_chunk(mu.shape[1]), fm.logical))
        with self.phase("decode_solve"):
            mels = self._solve(self.decode_solve, rows, mus, offsets)
        for s, _ in batch:
            self.streams[s.stream_id].frames.truncate()
        caches = [self.streams[s.stream_id].vocoder for s, _ in batch]
        if self.mel_tap is not None:
            pairs = zip(offsets, mels, strict=True)
            noise = [self.estimator.noise([o], m.shape[1])[0] for o, m in pairs]
            self.mel_tap([s.stream_id for s, _ in batch], mels, noise)
        with self.phase("decode_vocoder"):
            pcm = self.vocoder.run(mels, caches, [c.last for _, c in batch])
        for (s, _), cache in zip(batch, caches, strict=True):
            self.streams[s.stream_id].vocoder = cache
        return pcm

    def _solve(
        self,
        solver: GraphedSolve,
        rows: list[Row],
        mus: list[torch.Tensor],
        offsets: list[int],
    ) -> list[torch.Tensor]:
        """One batched decode solve; returns mel [80, n] per row. A graph's shape when one
        fits. A decode chunk has no prompt mel: ``cond`` stays zero."""
        lens = [m.shape[1] for m in mus]
        lo, hi = min(r[0] for r in rows), max(r[0] for r in rows) + 1
        frames = max(lens)
        key = solver.select(hi, frames)
        if key is not None:
            lo, hi, frames = 0, key.batch, key.frames
        with self.phase("host_inputs"):
            inputs = self._inputs(rows, lo, hi, frames, solver.trash)
        n = hi - lo
        x = torch.zeros(n, 80, frames, device=self.device)
        mu, cond = torch.zeros_like(x), torch.zeros_like(x)
        spk = torch.zeros(n, 80, device=self.device)
        noise = self.estimator.noise(offsets, max(lens))
        for i, (slot, row_spk, _, _) in enumerate(rows):
            j, f = slot - lo, lens[i]
            x[j, :, :f] = noise[i, :, :f]
            mu[j, :, :f] = mus[i]
            spk[j] = row_spk
        inputs.x, inputs.mu, inputs.cond, inputs.spk = x, mu, cond, spk
        with self.phase("estimator"):
            out = solver.run(key, inputs)
        return [out[r[0] - lo, :, : lens[i]] for i, r in enumerate(rows)]

    def _inputs(self, rows: list[Row], lo: int, hi: int, frames: int, trash: int) -> SolveInputs:
        """Host-built index tensors: where new frames go, which keys are valid, which rows write."""
        n, t = hi - lo, trash + 1
        write = torch.full((2 * n, frames), trash, dtype=torch.long)
        mask = torch.zeros(2 * n, 1, 1, t, dtype=torch.bool)
        mask[:, 0, 0, trash] = True  # rows outside this solve attend to their trash frame
        last = torch.zeros(2 * n, dtype=torch.long)
        active = torch.zeros(2 * n, dtype=torch.bool)
        key_range = torch.tensor([trash, trash + 1]).repeat(2 * n, 1)
        for slot, _, new, valid in rows:
            r = 2 * (slot - lo)
            write[r : r + 2, : len(new)] = torch.tensor(new, dtype=torch.long)
            mask[r : r + 2, 0, 0, trash] = False
            mask[r : r + 2, 0, 0, valid] = True
            last[r : r + 2] = len(new)
            active[r : r + 2] = True
            key_range[r : r + 2] = torch.tensor([min(valid), max(valid) + 1])
        dev = self.device
        empty = torch.empty(0, device=dev)
        return SolveInputs(
            lo,
            hi,
            empty,
            empty,
            empty,
            empty,
            to_device(write, dev),
            to_device(mask, dev),
            to_device(key_range, dev),
            to_device(last, dev),
            to_device(active, dev),
        )

    # graphs
    @torch.inference_mode()
    def precapture(self) -> int:
        """Capture the whole grid: decode solves, setup solves, then the vocoder (a failed
        capture stops all later ones, so the solves, which matter most, go first)."""
        return self.graphs.precapture(("decode", "setup", "hift", "hift_tail"))


def dit_dims(flow: CausalMaskedDiffWithXvec) -> tuple[int, int]:
    """The DiT's blocks and attention width, what a cached frame's size depends on."""
    est = flow.decoder.estimator
    attn = est.blocks[0].attn
    return len(est.blocks), attn.num_heads * attn.head_dim


def kv_frame_nbytes(flow: CausalMaskedDiffWithXvec, config: EngineConfig) -> int:
    """Device bytes of one key/value pool frame of this flow's DiT in the config's precision."""
    return kv_frame_bytes(config.n_timesteps, config.precision, *dit_dims(flow))


def kv_pool_frames(config: EngineConfig, frame_nbytes: int) -> int:
    """Frames of the streams' key/value pool: ``cache_mib`` of them, or as many as
    ``max_streams`` streams of the longest prompt use, whichever is fewer (the rows' trash
    frames come on top). Raises ValueError when the budget cannot hold one stream of the
    longest prompt; the contract's ``cache_mib_needed`` says the same of a profile."""
    longest = 2 * config.stream_frames(config.max_prompt_frames)
    every_slot = config.max_streams * longest
    if config.cache_mib is None:
        return every_slot
    frames = config.cache_mib * 2**20 // frame_nbytes
    if frames < longest:
        least = -(-longest * frame_nbytes // 2**20)
        raise ValueError(
            f"cache_mib {config.cache_mib} holds {frames} key/value frames; a stream of the "
            f"longest prompt ({config.max_prompt_frames} frames) needs {longest}: give it "
            f"at least {least} MiB (token2wav_cache_mib), or allow shorter prompts"
        )
    return min(frames, every_slot)


def _copy_frames(
    src_pool: torch.Tensor, src: torch.Tensor, dst_pool: torch.Tensor, dst: torch.Tensor
) -> None:
    """Frames ``src`` of one pool to frames ``dst`` of another (or the same), one Euler step
    at a time: the staging copy stays a tenth of the prompt's keys."""
    for step in range(src_pool.shape[0]):
        dst_pool[step].index_copy_(1, dst, src_pool[step].index_select(1, src))


def compute_flow(flow: CausalMaskedDiffWithXvec, precision: str) -> CausalMaskedDiffWithXvec:
    """The flow the encoder and the DiT run: the loaded one, or for ``bf16`` a bfloat16 copy
    (the loaded fp32 flow stays as it is: the reference and other engines share it)."""
    if precision != "bf16":
        return flow
    narrow = copy.deepcopy(flow).to(torch.bfloat16)
    # The solver's starting noise is part of its fp32 state (see BatchedEstimator.io_dtype).
    narrow.decoder.rand_noise = flow.decoder.rand_noise
    return narrow


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
