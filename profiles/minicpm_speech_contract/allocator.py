"""The CUDA caching allocator's settings for every process that runs the Code2Wav engine: the
serving pod's server (set by its supervisor) and the benches that stand in for it.

Expandable segments. With PyTorch's default segments, a burst of 64 cold voices on a C64 fp32
engine (per-voice pool, H100 80 GB, torch 2.11) grew the allocator's reserved memory from
50.3 GiB to 73.5 GiB in its first step while no step held more than 725 MiB beyond its start
and end: each new request size took a new segment, and the allocator ran out of device memory,
emptied its cache and retried. With expandable segments the same burst reserved at most
52.9 GiB, with no retry and the same step times (``bench/conv_memory.py``,
``runtime/bench-results/conv-memory-h100-*``). Beside the LLM stages on one GPU, reserved
memory is what the others lose.

Both variable names, with one value: PyTorch 2.9 and later read ``PYTORCH_ALLOC_CONF`` first
and warn at every start where only the older ``PYTORCH_CUDA_ALLOC_CONF`` is set; earlier
releases read only the older. A value the pod's own environment already sets under either name
is kept.

vLLM refuses expandable segments beside a KV connector (``kv_transfer_config``) unless its cumem
allocator is on, since a remap would leave pinned KV registrations stale. The deploy configs the
operator renders configure none: vLLM-Omni's stages talk through its own connectors.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_ENV_NEW = "PYTORCH_ALLOC_CONF"
ALLOC_CONF = "expandable_segments:True"


def with_allocator_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` plus the engine's allocator settings, unless it already chooses its own."""
    env = dict(environ)
    if ALLOC_CONF_ENV not in env and ALLOC_CONF_ENV_NEW not in env:
        env[ALLOC_CONF_ENV] = env[ALLOC_CONF_ENV_NEW] = ALLOC_CONF
    return env
