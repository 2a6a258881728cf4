"""How much device memory one engine op may ask for beyond the engine's own buffers.

The engine preallocates what it keeps (slots' caches, the setup cache, graph pools); an op asks
the caching allocator only for its output and scratch. cuDNN's scratch is the one that needed a
rule. It chooses a convolution's plan on the first call of each shape and asks for that plan's
workspace then. In fp32 with TF32 off, its heuristics' first plan for the encoder's 1-D convs
(512 channels, a few hundred frames, batch 16 and up) asked for up to 140 GiB on an H200
(torch 2.11, cuDNN 9.19), and ran a call in 148 ms; where the workspace did not fit, PyTorch
caught the OOM, emptied the allocator's cache and tried the next plan. Beside the LLM stages
on one GPU, that takes their memory at every new shape of a burst of new voices.
``CUDNN_CONV_WSCAP_DBG``, PyTorch's documented workspace cap, changed none of it there.

So the engine runs fp32 convolutions with cuDNN off: PyTorch's own CUDA convolution, an im2col
of one batch element at a time and a GEMM, whose only scratch is that element's columns (tens
of MiB at HiFT's largest), as fast as cuDNN's fp32 plans or faster on these shapes. Where TF32
is allowed, cuDNN's plans asked for at most 134 MiB across the same shapes and stay in use.
``bench/conv_memory.py`` runs every conv the engine can make, at every batch, against
:data:`OP_MEMORY_BOUND_BYTES`, TF32 on and off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from minicpm_speech_contract.allocator import ALLOC_CONF, ALLOC_CONF_ENV, with_allocator_conf

OP_MEMORY_BOUND_BYTES = 1 << 30  # what any one op may ask for beyond the engine's buffers


@contextlib.contextmanager
def bounded_convs(fp32: bool) -> Iterator[None]:
    """Inside, with ``fp32`` (convolutions in fp32, TF32 off), convolutions run without cuDNN;
    otherwise nothing changes.

    The switch is process-wide while inside: a conv another thread runs meanwhile takes the
    same bounded path, which computes the same result.
    """
    if not fp32 or not torch.backends.cudnn.enabled:
        yield
        return
    torch.backends.cudnn.enabled = False
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = True


@contextlib.contextmanager
def without_tf32(bounded: bool = True) -> Iterator[None]:
    """Inside, matmuls and convolutions run in plain fp32 (TF32 off), and with ``bounded``
    the convolutions without cuDNN, as :func:`bounded_convs` says why; the flags before are
    restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with bounded_convs(bounded):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def use_serving_allocator() -> None:
    """Give this process the CUDA allocator settings the serving pod's server runs with
    (:mod:`minicpm_speech_contract.allocator`), so that a bench measures what the pod runs.
    Call it before the first CUDA allocation: the allocator reads them once."""
    added = {k: v for k, v in with_allocator_conf(os.environ).items() if k not in os.environ}
    if not added:
        return
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError(f"CUDA is already initialised: set {ALLOC_CONF_ENV}="
                           f"{ALLOC_CONF!r} before it is, or in the environment")
    os.environ.update(added)


def expandable_segments_in_use() -> bool:
    """Whether the caching allocator's segments are expandable: what the settings did."""
    snapshot = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call]
    return any(seg.get("is_expandable") for seg in snapshot)
