"""Engine configuration: one slotted, validated dataclass (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from minicpm_speech_contract.extras import (
    DEFAULTS,
    ENGINE_CHUNK_TOKENS,
    ENGINE_HISTORY_FRAMES,
    ENGINE_LOOKAHEAD_TOKENS,
    ENGINE_MAX_PROMPT_FRAMES,
    PRECISIONS,
    stream_cache_frames,
)

CODEBOOK_SIZE = 6561  # speech token ids 0..6560; 6561 is the Talker's EOS and never a token here
# The contract promises these to deploy configs (codec_chunk_frames, codec_left_context_frames).
CHUNK_TOKENS = ENGINE_CHUNK_TOKENS  # tokens consumed per chunk (1 s of audio at 25 Hz)
LOOKAHEAD_TOKENS = ENGINE_LOOKAHEAD_TOKENS  # the encoder's pre-lookahead, kept until the end
MAX_PROMPT_FRAMES = ENGINE_MAX_PROMPT_FRAMES  # a 10 s reference at 50 mel frames a second
MIN_PROMPT_TOKENS = 2  # a prompt's encoder lookahead cache needs two frames to continue from
PROMPT_PAD_TOKEN = 4218  # the reference pads the prompt's lookahead with this (silence) token
HISTORY_FRAMES = ENGINE_HISTORY_FRAMES  # the reference keeps prompt + 100 frames of history


@dataclass(slots=True)
class EngineConfig:
    """What the engine is sized and switched by.

    ``max_streams`` slots are preallocated; ``max_prompt_frames`` bounds a voice's 50 Hz prompt
    mel (2 per prompt token; 500 = a 10 s reference). ``micro_batch`` bounds one cold-setup group.
    A group's prompts are solved packed end to end in one row pair (``micro_batch`` prompts,
    at most ``micro_batch * max_prompt_frames`` frames).
    With ``cuda_graphs`` (CUDA devices only) the solves and the vocoder replay graphs of a grid:
    decode: batch sizes 1, 2, 4, ... up to ``max_streams`` by 50 and 56 frames; setup: packed
    widths, multiples of ``setup_frame_step`` up to the group's most frames; at most
    ``graph_budget`` graphs, captured by ``Code2WavEngine.warmup`` when ``precapture``.
    A voice's cold setup is a pure function of the voice, so its result (prompt keys/values,
    conv and encoder caches) is kept in an LRU of ``setup_cache_mib`` (and at most
    ``setup_cache_voices`` voices) and copied to later streams of that voice instead of being
    solved again. ``fused_kernels`` runs the DiT's memory-bound steps and HiFT's Snake as
    Triton kernels where Triton and CUDA are present (same fp32 arithmetic as the torch ops).
    ``bounded_convs`` runs fp32 convolutions (TF32 off) without cuDNN, whose plans asked for
    up to 140 GiB of workspace (:mod:`.workspace`); off only to measure that.
    ``vocoder_tf32`` off runs HiFT and its F0 predictor in plain fp32 whatever ``tf32`` says:
    vLLM-Omni measured TF32 there to shift the log-mel by 0.7-1.4 dB; on an H100 it cost
    ``bf16`` at C64 three quarters of its throughput for 0.7 dB, so it stays a parity setting.
    A stream's estimator keys and values take :meth:`stream_frames` of its own prompt from a
    pool of ``cache_mib`` of device memory; unset, the pool holds ``max_streams`` streams of
    the longest prompt, so a free slot always admits. A smaller pool serves more streams per
    GiB where prompts are shorter than the longest allowed; a stream waits for frames to
    free (:meth:`Code2WavEngine.admits`) when the pool cannot hold its prompt yet.
    """

    max_streams: int = 8
    max_prompt_frames: int = MAX_PROMPT_FRAMES
    micro_batch: int = DEFAULTS.micro_batch_size
    n_timesteps: int = 10
    tf32: bool = True
    fused_kernels: bool = True
    cuda_graphs: bool = True
    precapture: bool = True
    graph_budget: int = DEFAULTS.cfm_max_graphs
    vocoder_graphs: bool = True
    vocoder_tf32: bool = True
    setup_frame_step: int = 256
    idle_timeout_s: float = 30.0
    setup_cache_mib: int = 2048  # device memory for set-up voices (LRU); 0 turns the cache off
    setup_cache_voices: int | None = None  # and at most this many voices, if given (0: off)
    bounded_convs: bool = True
    precision: str = DEFAULTS.token2wav_precision  # one of the contract's PRECISIONS
    cache_mib: int | None = None  # the estimator's key/value pool; None: every slot at most

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError("max_streams must be >= 1")
        if self.max_prompt_frames < 2 or self.max_prompt_frames % 2:
            raise ValueError("max_prompt_frames must be an even number >= 2")
        if not 1 <= self.micro_batch <= self.max_streams:
            raise ValueError("micro_batch must be in 1..max_streams")
        if self.n_timesteps < 1:
            raise ValueError("n_timesteps must be >= 1")
        if self.graph_budget < 0:
            raise ValueError("graph_budget must be >= 0")
        if self.setup_frame_step < 1:
            raise ValueError("setup_frame_step must be >= 1")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be > 0")
        if self.setup_cache_mib < 0:
            raise ValueError("setup_cache_mib must be >= 0")
        if self.setup_cache_voices is not None and self.setup_cache_voices < 0:
            raise ValueError("setup_cache_voices must be >= 0")
        if self.cache_mib is not None and self.cache_mib < 1:
            raise ValueError("cache_mib must be >= 1 (or unset)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}")

    @property
    def max_chunk_frames(self) -> int:
        """Frames of the largest chunk: a last chunk of 25 + 3 tokens, 2 frames each."""
        return 2 * (CHUNK_TOKENS + LOOKAHEAD_TOKENS)

    @property
    def setup_pack_frames(self) -> int:
        """Frames of the widest packed setup: ``micro_batch`` of the longest prompts."""
        return self.micro_batch * self.max_prompt_frames

    @property
    def setup_frame_buckets(self) -> list[int]:
        step, top = self.setup_frame_step, self.setup_pack_frames
        return [*range(step, top, step), top]

    @property
    def cache_frames(self) -> int:
        """Positions of each estimator row: the longest prompt's stream, one trash position.

        Rounded up to a multiple of 8 so the attention matmuls over the positions get aligned,
        vectorised kernels (an odd length selects byte-aligned ones, about twice as slow).
        A row's positions are frames of a pool (:class:`~.estimator.BatchedEstimator`); only
        the ones its stream uses take memory.
        """
        return _aligned(self.stream_frames(self.max_prompt_frames) + 1)

    def stream_frames(self, prompt_frames: int) -> int:
        """Cache positions a stream of this prompt ever holds: its prompt, the history kept
        after it, and one chunk being added (:class:`~.state.FrameMap`)."""
        return stream_cache_frames(prompt_frames)

    @property
    def setup_cache_frames(self) -> int:
        """Positions of the packed setup's row pair: its widest solve and a trash frame."""
        return _aligned(self.setup_pack_frames + 1)


def _aligned(frames: int) -> int:
    return -(-frames // 8) * 8
