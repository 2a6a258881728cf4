"""Four ways to run the encoder's fp32 1-D convolutions, side by side: the memory each call asks
for beyond its input and output, the allocator's OOMs and retries, first-call and steady time.

Policies, each in a fresh process (cuDNN's plan cache and the allocator start empty):

* ``default``: cuDNN as PyTorch calls it;
* ``wscap256``: the same with ``CUDNN_CONV_WSCAP_DBG=256`` set before start-up, PyTorch's
  documented cap on cuDNN's workspace, in MiB; ``late256`` sets it after a first conv;
* ``nocudnn``: ``torch.backends.cudnn.enabled = False``, PyTorch's own CUDA convolution;
* ``gemm``: one batched matmul per tap, accumulated in place.

The shapes are the encoder's: ``Conv1d(512, 512, k)`` for its lookahead (k 3, 4) and up-sampling
(k 5) convs at the batches and lengths a burst of new voices gives them. This is the measurement
behind :mod:`..engine.workspace`; ``conv_memory`` then sweeps every conv of the engine.

Usage::

    python -m minicpm_speech_runtime.bench.conv_policies --json conv-policies.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

POLICIES = (("default", "off"), ("wscap256", "off"), ("late256", "off"), ("nocudnn", "off"),
            ("gemm", "off"), ("default", "on"), ("wscap256", "on"))
SHAPES = (  # (in, out, kernel, batch, frames)
    [(512, 512, 3, b, t) for b in (1, 8, 16, 20, 24, 32, 48, 64) for t in (28, 164, 200, 256)]
    + [(512, 512, 4, b, t) for b in (16, 24, 64) for t in (167, 256)]
    + [(512, 512, 5, b, t) for b in (16, 24, 64) for t in (332, 516)]
)


def _gemm_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, _, t = x.shape
    k = w.shape[2]
    xt = x.transpose(1, 2)
    y = xt[:, : t - k + 1] @ w[:, :, 0].t()
    for j in range(1, k):
        y.baddbmm_(xt[:, j : j + t - k + 1], w[:, :, j].t().expand(b, -1, -1))
    return y.transpose(1, 2)


def measure(policy: str, tf32: bool) -> dict[str, Any]:
    """Every shape once under ``policy``, in this process."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    torch.manual_seed(0)

    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _gemm_conv(x, w) if policy == "gemm" else F.conv1d(x, w)

    if policy == "late256":
        F.conv1d(torch.randn(1, 8, 16, device=dev), torch.randn(8, 8, 3, device=dev))
        os.environ["CUDNN_CONV_WSCAP_DBG"] = "256"
    if policy == "nocudnn":
        torch.backends.cudnn.enabled = False
    rows = []
    for cin, cout, k, b, t in SHAPES:
        w = torch.randn(cout, cin, k, device=dev) * 0.02
        x = torch.randn(b, cin, t, device=dev)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        s0 = torch.cuda.memory_stats()
        t0 = time.perf_counter()
        y = conv(x, w)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        s1 = torch.cuda.memory_stats()
        peak = torch.cuda.max_memory_allocated() - base - y.numel() * 4
        t0 = time.perf_counter()
        for _ in range(5):
            y = conv(x, w)
        torch.cuda.synchronize()
        rows.append(dict(
            k=k, b=b, t=t, first_ms=first * 1e3, steady_ms=(time.perf_counter() - t0) / 5 * 1e3,
            extra_mib=peak / 2**20,
            ooms=s1.get("num_ooms", 0) - s0.get("num_ooms", 0),
            retries=s1.get("num_alloc_retries", 0) - s0.get("num_alloc_retries", 0),
        ))
        del x, w, y
        torch.cuda.empty_cache()
    worst = max(rows, key=lambda r: r["extra_mib"])
    return dict(
        policy=policy, tf32="on" if tf32 else "off", env=os.environ.get("CUDNN_CONV_WSCAP_DBG"),
        torch=torch.__version__, cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
        worst=worst, ooms=sum(r["ooms"] for r in rows), retries=sum(r["retries"] for r in rows),
        max_first_ms=max(r["first_ms"] for r in rows), rows=rows,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="all policies' results (runs each in a process)")
    p.add_argument("--one", nargs=2, metavar=("POLICY", "TF32"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(measure(a.one[0], a.one[1] == "on")))
        return
    if a.json is None:
        p.error("--json is required")
    results = []
    for policy, tf32 in POLICIES:
        env = dict(os.environ)
        if policy == "wscap256":
            env["CUDNN_CONV_WSCAP_DBG"] = "256"
        out = subprocess.run([sys.executable, "-m", __spec__.name if __spec__ else __name__,
                              "--one", policy, tf32], env=env, capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout)
        w = r["worst"]
        print(f"{policy:10s} tf32={tf32:3s} worst extra {w['extra_mib']:9.0f} MiB at k{w['k']} "
              f"b{w['b']} t{w['t']}  OOMs {r['ooms']}  retries {r['retries']}  "
              f"slowest first call {r['max_first_ms']:.0f} ms", flush=True)
        results.append(r)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"policies": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
