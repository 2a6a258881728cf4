"""The DiT attention kernel's tile sizes on the engine's two shapes, timed on one device.

``setup``: one packed setup solve's attention (2 CFG rows, prompts end to end, a key range per
frame); ``decode``: a 64-stream decode solve's (128 rows of a 50-frame chunk over their cache,
keys past each row's range masked, as the engine masks them). For each (query block, key
block, warps, pipeline stages) it reports the time per call and the largest difference from
the engine's current choice (TF32 sums in another order differ by ~1e-3). Prints a table and
writes JSON.

Usage::

    python -m minicpm_speech_runtime.bench.attention_tiles --json /tmp/tiles.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

HEADS, HEAD_DIM = 8, 64  # the DiT's attention at real dims
SETUP_PROMPTS = (436, 436, 450, 450, 470, 470, 478, 478)  # the burst's longest group of 8
GRID = {"bm": (64, 128), "bn": (32, 64, 128), "warps": (4, 8), "stages": (2, 3)}


def setup_case(
    dev: torch.device, prompts: tuple[int, ...] = SETUP_PROMPTS, bucket: int = 256
) -> dict[str, Any]:
    from ..engine.setup_solve import PackLayout, packed_indices

    frames = -(-sum(prompts) // bucket) * bucket
    keys = frames + 8
    ix = packed_indices(PackLayout(prompts, frames), 2 * len(prompts))
    return {
        "q": torch.randn(2, HEADS, frames, HEAD_DIM, device=dev),
        "k": torch.randn(2 * keys, HEADS, HEAD_DIM, device=dev),  # the pool's [P, H, D]
        "v": torch.randn(2 * keys, HEADS, HEAD_DIM, device=dev),
        "table": torch.arange(2 * keys, device=dev).view(2, keys),  # the setup's, identity
        "bias": torch.zeros(2, 1, 1, keys, device=dev),
        "range": ix["key_range"].to(dev),
    }


def decode_case(
    dev: torch.device, streams: int = 64, valid: int = 600, frames: int = 50, keys: int = 656
) -> dict[str, Any]:
    rows = 2 * streams
    bias = torch.full((rows, 1, 1, keys), float("-inf"), device=dev)
    bias[..., :valid] = 0.0
    return {
        "q": torch.randn(rows, HEADS, frames, HEAD_DIM, device=dev),
        "k": torch.randn(rows * keys, HEADS, HEAD_DIM, device=dev),
        "v": torch.randn(rows * keys, HEADS, HEAD_DIM, device=dev),
        # each row's frames one run of the pool, as a stream's are when it starts
        "table": torch.arange(rows * keys, device=dev).view(rows, keys),
        "bias": bias,
        "range": torch.tensor([[0, valid]] * rows, device=dev),
    }


def launcher(case: dict[str, Any], tiles: tuple[int, int, int, int]) -> Callable[[], Any]:
    from ..engine import triton_kernels as tk

    args = (case["q"], case["k"], case["v"], case["table"], case["bias"], case["range"])
    return lambda: tk.attention(*args, tiles=tiles)


def current_tiles(case: dict[str, Any]) -> tuple[int, int, int, int]:
    """The tiles the engine chooses for this shape."""
    from ..engine import triton_kernels as tk

    return tk.attention_tiles(case["q"].shape[2], case["range"].dim() == 3)


def timed_ms(fn: Callable[[], Any], reps: int) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def sweep(
    case: dict[str, Any], grid: dict[str, tuple[int, ...]], reps: int
) -> list[dict[str, Any]]:
    current = current_tiles(case)
    want = launcher(case, current)().clone()
    rows = []
    for cfg in itertools.product(*grid.values()):
        row: dict[str, Any] = dict(zip(grid, cfg, strict=True))
        try:
            run = launcher(case, cast("tuple[int, int, int, int]", cfg))
            row["ms"] = timed_ms(run, reps)
            row["max_diff"] = float((run() - want).abs().max())
        except Exception as exc:  # a tile too large for shared memory fails to compile
            row["error"] = f"{type(exc).__name__}: {exc}"[:120]
        row["current"] = cfg == current
        rows.append(row)
    return sorted(rows, key=lambda r: r.get("ms", float("inf")))


def main() -> None:
    p = argparse.ArgumentParser(description="attention tile sizes on the engine's shapes")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--small", action="store_true", help="tiny shapes and grid (a CPU check)")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    if a.small:  # the engine's tiles for these shapes are 16 x 64: the grid holds them
        grid = {"bm": (16, 32), "bn": (64,), "warps": (4,), "stages": (3,)}
        cases = {"setup": setup_case(dev, (6, 10), 16), "decode": decode_case(dev, 1, 20, 8, 24)}
    else:
        grid = GRID
        cases = {"setup": setup_case(dev), "decode": decode_case(dev)}
    doc: dict[str, Any] = {"device": str(dev), "grid": grid, "shapes": {}}
    print(f"{'shape':8} {'bm':>4} {'bn':>4} {'warps':>5} {'stages':>6} {'ms':>8} {'max diff':>9}")
    for name, case in cases.items():
        rows = sweep(case, grid, a.reps)
        current = current_tiles(case)
        doc["shapes"][name] = {"current": current, "q": list(case["q"].shape), "rows": rows}
        for r in rows[:5] + [r for r in rows[5:] if r["current"]]:
            mark = " (current)" if r["current"] else ""
            print(
                f"{name:8} {r['bm']:>4} {r['bn']:>4} {r['warps']:>5} {r['stages']:>6} "
                f"{r.get('ms', float('nan')):8.4f} {r.get('max_diff', float('nan')):9.2e}{mark}"
            )
    a.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
