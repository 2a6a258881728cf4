"""Owns every device buffer: estimator caches by slot, per-stream encoder and vocoder caches,
the static graph buffers and the graph dispatcher.

A new stream takes the lowest free slot and keeps it while the slots in use fit the smallest
decode graph that holds that many streams: moving a stream costs a copy of its whole cache
(~0.6 ms at real dims; ~6 moves, 5 ms, of a 64-stream step when every leaving stream's slot was
refilled from the top). Only when the highest slot in use is past that graph size is it moved
into the lowest free slot, so a shrinking load still runs the smaller graphs.
A decode solve covers slots ``[0, batch)`` of the smallest graph that holds every stream in it;
free slots and streams without a ready chunk are inactive rows there.
A setup group's prompts are packed end to end in a scratch estimator of one row pair
(:mod:`.setup_solve`), and each prompt's caches are then copied to its stream's slot.
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

from ..assets import Code2WavModels
from .config import (
    CHUNK_TOKENS,
    LOOKAHEAD_TOKENS,
    PROMPT_PAD_TOKEN,
    EngineConfig,
)
from .encoder import BatchedEncoder, EncoderCache
from .estimator import BatchedEstimator, GraphedSolve, SolveInputs
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
        self.estimator = BatchedEstimator(
            self.compute_flow.decoder, config.max_streams, config.cache_frames, steps,
            self.kernels,
            cache_dtype=cache_dtype,
        )
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
            models.hift, models.device, self.graphs, hift_sizes, self.kernels
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

    def attach(self, s: StreamState) -> None:
        if self.num_live >= self.config.max_streams:
            raise RuntimeError("no free stream slot")
        s.slot = self.owner.index(None)
        self.owner[s.slot] = s
        spk = self.flow.spk_embed_affine_layer(F.normalize(s.voice.spk_emb, dim=1))
        fm = FrameMap(s.prompt_frames, self.trash)
        self.streams[s.stream_id] = DeviceStream(
            spk[0], s.prompt_frames, fm, VocoderCache.empty(self.device), self.encoder.new_cache()
        )

    def detach(self, s: StreamState) -> None:
        self.encoder.release(self.streams.pop(s.stream_id).encoder)
        self.owner[s.slot] = None
        s.slot = -1
        fits = min(n for n in self.decode_sizes if n >= max(self.num_live, 1))
        while (top := self._highest_slot()) >= fits:
            self._move(top, self.owner.index(None))

    def scrub(self, s: StreamState) -> None:
        """Zero the stream's estimator rows and encoder cache: a masked key or value is
        multiplied by 0, and 0 * NaN would carry a failed stream's NaN into the next one."""
        est, rows = self.estimator, slice(2 * s.slot, 2 * s.slot + 2)
        for buf in (est.k, est.v, est.conv):
            buf[:, :, rows].zero_()
        self.encoder.scrub(self.streams[s.stream_id].encoder)

    def _highest_slot(self) -> int:
        return max((i for i, o in enumerate(self.owner) if o is not None), default=-1)

    def _move(self, src: int, dst: int) -> None:
        est = self.estimator
        for buf in (est.k, est.v, est.conv):
            buf[:, :, 2 * dst : 2 * dst + 2].copy_(buf[:, :, 2 * src : 2 * src + 2])
        moved = self.owner[src]
        assert moved is not None
        self.owner[dst], self.owner[src] = moved, None
        moved.slot = dst
        self.slot_moves += 1

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
        (slot to slot: the leader's caches are read in place)."""
        self._restore(s, self._snapshot(leader, copy=False))

    def _snapshot(self, s: StreamState, copy: bool = True) -> VoiceSetup:
        """The stream's set-up caches: a copy, or views of its slot with ``copy=False``."""
        est, p, rows = self.estimator, s.prompt_frames, slice(2 * s.slot, 2 * s.slot + 2)
        parts = [est.k[:, :, rows, :, :p], est.v[:, :, rows, :, :p], est.conv[:, :, rows]]
        if copy:
            parts = [t.clone() for t in parts]
        encoder = self.encoder.export_state(self.streams[s.stream_id].encoder, copy)
        k, v, conv = parts
        return VoiceSetup(k, v, conv, encoder)

    def _restore(self, s: StreamState, entry: VoiceSetup) -> None:
        est, p, rows = self.estimator, s.prompt_frames, slice(2 * s.slot, 2 * s.slot + 2)
        est.k[:, :, rows, :, :p].copy_(entry.k)
        est.v[:, :, rows, :, :p].copy_(entry.v)
        est.conv[:, :, rows].copy_(entry.conv)
        d = self.streams[s.stream_id]
        d.frames.setup()
        self.encoder.import_state(d.encoder, entry.encoder)

    def _adopt(self, j: int, start: int, s: StreamState) -> None:
        """Copy the ``j``-th prompt of a packed setup (keys and values at ``start``, conv
        caches in conv rows ``2j, 2j + 1``) into the stream's slot."""
        a, b, p, dst = self.setup_estimator, self.estimator, s.prompt_frames, s.slot
        for sbuf, dbuf in ((a.k, b.k), (a.v, b.v)):  # [steps, depth, 2 slots, H, T, D]
            dbuf[:, :, 2 * dst : 2 * dst + 2, :, :p].copy_(sbuf[:, :, 0:2, :, start : start + p])
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
