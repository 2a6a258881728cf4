"""Run under ``TRITON_INTERPRET=1``: the Triton kernels vs the torch ops they replace.

Prints one JSON object of max abs differences: each kernel on awkward shapes (widths that are
not powers of two, masked keys), then one whole batched solve at the tiny checkpoint's dims with
ragged rows, comparing the velocity output and every cache the solve writes.
Usage: ``TRITON_INTERPRET=1 python fused_kernels_check.py CHECKPOINT_DIR``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from minicpm_speech_contract.extras import PRECISIONS
from minicpm_speech_runtime.assets import load_code2wav
from minicpm_speech_runtime.engine.estimator import BatchedEstimator, PackedRows, SolveInputs
from minicpm_speech_runtime.engine.kernels import Kernels
from minicpm_speech_runtime.engine.runner import compute_flow


def _interpreter_scalar_loop_bounds() -> None:
    """Triton 3.5's interpreter turns a loaded scalar (a 1-element array) into a loop bound with
    ``int(array)``, which NumPy 2.4 refuses; the compiled kernel has no such step."""
    import triton.runtime.interpreter as interp

    patch_tensor = interp._patch_lang_tensor

    def patched(tensor: Any) -> None:
        patch_tensor(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    interp._patch_lang_tensor = patched


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max())


def kernel_diffs(fused: Kernels, eager: Kernels) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    out: dict[str, float] = {}
    for c in (64, 80):
        x, y, gate, w, b = rnd(3, 5, c), rnd(3, 5, c), rnd(c), rnd(c), rnd(c)
        got, want = (
            fused.residual_norm(x, gate, y, (w, b), 1e-6),
            eager.residual_norm(x, gate, y, (w, b), 1e-6),
        )
        out[f"residual_norm_{c}"] = max(diff(got[0], want[0]), diff(got[1], want[1]))
        got, want = (
            fused.residual_norm(x, None, None, (w, b), 1e-6),
            eager.residual_norm(x, None, None, (w, b), 1e-6),
        )
        out[f"norm_{c}"] = diff(got[1], want[1])
        h = 3 * rnd(3, 5, c)  # wide enough for Mish's tails and softplus's threshold
        out[f"norm_mish_{c}"] = diff(
            fused.norm_mish(h, (w, b), 1e-5), eager.norm_mish(h, (w, b), 1e-5)
        )
    heads, d, frames, t = 3, 16, 7, 40
    qkv = rnd(2, frames, 3 * heads * d)
    qn, kn = (rnd(d), rnd(d)), (rnd(d), rnd(d))
    pos = torch.stack([torch.arange(frames) + 3, torch.full((frames,), t - 1)])  # row 1: trash
    rows = (torch.arange(2)[:, None].expand(-1, frames), pos)
    # each row's positions are pool frames in a scrambled order, as a long-lived pool has them
    table = torch.randperm(2 * t + 5, generator=g)[: 2 * t].view(2, t)
    pools = [rnd(2 * t + 5, heads, d) for _ in range(2)]
    kc, vc = (c.clone() for c in pools)
    want_q = eager.qkv_into_cache(qkv, heads, d, qn, kn, 1e-6, kc, vc, table, rows)
    fk, fv = (c.clone() for c in pools)
    got_q = fused.qkv_into_cache(qkv, heads, d, qn, kn, 1e-6, fk, fv, table, rows)
    # row 1 writes every frame to one position (which wins is unordered): compare row 0's
    mine = table[0]
    out["qkv_into_cache"] = max(
        diff(got_q, want_q), diff(fk[mine], kc[mine]), diff(fv[mine], vc[mine])
    )
    written = table[0, pos[0]]  # the frames row 0's new keys went to, changed alike
    changed = not torch.equal(kc[written], pools[0][written])
    out["qkv_into_cache_wrote_rows_frames"] = diff(fk[written], kc[written]) + (not changed)

    # attention: rows with valid keys in [5, 29) (a block boundary inside), one row whose only
    # key is the trash frame, frames past one 64-frame block, a -inf block before valid keys
    r, f = 4, 70
    q = rnd(r, heads, f, d)
    table = torch.randperm(r * t, generator=g).view(r, t)
    kc, vc = rnd(r * t, heads, d), rnd(r * t, heads, d)
    bias = torch.full((r, 1, 1, t), float("-inf"))
    rng = torch.tensor([[5, 29], [5, 29], [t - 1, t], [0, 17]])
    for i, (lo, hi) in enumerate(rng.tolist()):
        bias[i, ..., lo:hi] = 0
    bias[0, ..., 7] = bias[3, ..., 3] = float("-inf")  # holes inside the range
    out["attention"] = diff(
        fused.attention(q, kc, vc, table, bias, rng),
        eager.attention(q, kc, vc, table, bias.clone(), rng),
    )
    # the table is read: the same keys laid out in position order give the same result
    dense = (kc[table].flatten(0, 1), vc[table].flatten(0, 1), torch.arange(r * t).view(r, t))
    out["attention_through_table"] = diff(
        fused.attention(q, *dense, bias, rng), eager.attention(q, kc, vc, table, bias, rng)
    )

    # conv taps: channels past one 256-wide block, a strided cache half, rows ending at 0
    # (an inactive row keeps its cache), mid-way and at the last frame
    for c in (80, 300):
        x = rnd(3, 6, c)
        cache = rnd(3, 2, 2 * c)[:, :, c:]
        last = torch.tensor([0, 4, 6])
        got, want = fused.conv_taps(x, cache, last), eager.conv_taps(x, cache, last)
        out[f"conv_taps_{c}"] = max(diff(got[0], want[0]), diff(got[1], want[1]))

    # prompts packed end to end: a key range per frame, segments [0, 3), [3, 50) and [50, 70)
    # (a boundary inside a 64-frame block and a block past it)
    first = torch.tensor([0] * 3 + [3] * 47 + [50] * 20)
    per_frame = torch.stack([first, torch.tensor([3] * 3 + [50] * 47 + [70] * 20)], dim=-1)
    per_frame = per_frame.expand(2, -1, -1).contiguous()
    q, kc, vc = rnd(2, heads, f, d), rnd(2 * 72, heads, d), rnd(2 * 72, heads, d)
    table = torch.randperm(2 * 72, generator=g).view(2, 72)
    zero = torch.zeros(2, 1, 1, 72)
    out["attention_packed"] = diff(
        fused.attention(q, kc, vc, table, zero, per_frame),
        eager.attention(q, kc, vc, table, zero, per_frame),
    )
    # packed conv taps: segments [0, 2), [2, 7), [7, 9), each from a zero cache
    starts = torch.tensor([0, 0, 2, 2, 2, 2, 2, 7, 7]).expand(2, -1).contiguous()
    for c in (80, 300):
        x = rnd(2, 9, c)
        got, want = fused.conv_taps_packed(x, starts), eager.conv_taps_packed(x, starts)
        out[f"conv_taps_packed_{c}"] = diff(got, want)

    x, alpha = 4 * rnd(2, 5, 33), rnd(5).abs() + 0.1
    out["snake"] = diff(fused.snake(x, alpha), eager.snake(x, alpha))
    return out


def hift_diffs(fused: Kernels) -> dict[str, float]:
    """A narrow HiFT (the reference's class) with its Snakes fused vs as shipped."""
    from minicpm_speech_runtime.bench.parity import fixed_nsf_noise, narrow_hift
    from minicpm_speech_runtime.engine.vocoder import _overridden, snake_overrides

    hift = narrow_hift()
    mel, src = torch.randn(2, 80, 12), torch.zeros(2, 1, 0)
    with torch.inference_mode(), fixed_nsf_noise():
        want = hift(mel, src)
        with _overridden(snake_overrides(hift, fused)):
            got = hift(mel, src)
        again = hift(mel, src)  # the override is gone after the context
    overridden = sum("forward" in vars(m) for m in hift.modules())
    return {
        "hift_speech": diff(got[0], want[0]),
        "hift_source": diff(got[1], want[1]),
        "hift_after_context": diff(again[0], want[0]) + overridden,
    }


def fused_vs_torch(
    name: str, make: Callable[[Kernels], tuple[BatchedEstimator, SolveInputs]]
) -> dict[str, float]:
    """One solve with the Triton kernels and one with the torch ops: how far apart the
    velocities and every cache the solve writes are."""
    runs = []
    for fused in (True, False):
        est, s = make(Kernels(fused))
        with torch.inference_mode():
            runs.append((est.solve(s), est))
    (a, ea), (b, eb) = runs
    return {
        name: diff(a, b),
        f"{name}_k_cache": diff(ea.k, eb.k),
        f"{name}_v_cache": diff(ea.v, eb.v),
        f"{name}_conv_cache": diff(ea.conv, eb.conv),
    }


def solve_diffs(checkpoint: str, precision: str = "fp32") -> dict[str, float]:
    """One batched decode solve with ragged rows, fused vs torch, in one of the precisions."""
    models = load_code2wav(checkpoint, "cpu")
    flow = compute_flow(models.flow, precision)
    cache_dtype = torch.bfloat16 if precision == "bf16-cache" else None
    frames, t = 9, 24

    def make(kernels: Kernels) -> tuple[BatchedEstimator, SolveInputs]:
        est = BatchedEstimator(flow.decoder, 2, t, 10, kernels, cache_dtype=cache_dtype,
                               pool_frames=4 * t + 3)
        g = torch.Generator().manual_seed(1)
        # every position its own frame, scattered over a pool larger than the rows need
        est.table.copy_(torch.randperm(4 * t + 3, generator=g)[: 4 * t].view(4, t))
        n, r = 2, 4
        lens = [frames, frames - 3]  # ragged: the second stream's last 3 frames are padding
        write = torch.full((r, frames), t - 1, dtype=torch.long)
        mask = torch.zeros(r, 1, 1, t, dtype=torch.bool)
        for i, f in enumerate(lens):
            write[2 * i : 2 * i + 2, :f] = torch.arange(f)
            mask[2 * i : 2 * i + 2, 0, 0, :f] = True
        x = torch.randn(n, 80, frames, generator=g)
        mu = torch.randn(n, 80, frames, generator=g)
        x[1, :, lens[1] :] = mu[1, :, lens[1] :] = 0
        s = SolveInputs(
            0,
            n,
            x,
            mu,
            torch.randn(n, 80, generator=g),
            torch.randn(n, 80, frames, generator=g),
            write,
            mask,
            torch.tensor([[0, lens[0]]] * 2 + [[0, lens[1]]] * 2),
            torch.tensor([lens[0]] * 2 + [lens[1]] * 2),
            torch.ones(r, dtype=torch.bool),
        )
        return est, s

    return fused_vs_torch(_named("solve", precision), make)


def _named(name: str, precision: str) -> str:
    return name if precision == "fp32" else f"{name}_{precision.replace('-', '_')}"


def packed_solve_diffs(checkpoint: str, precision: str = "fp32") -> dict[str, float]:
    """One packed setup solve (prompts of 6 and 4 frames, 2 frames of padding), fused vs torch."""
    from minicpm_speech_runtime.engine.setup_solve import PackLayout, packed_indices

    models = load_code2wav(checkpoint, "cpu")
    flow = compute_flow(models.flow, precision)
    cache_dtype = torch.bfloat16 if precision == "bf16-cache" else None
    layout, t = PackLayout((6, 4), 12), 16
    ix = packed_indices(layout, 4)

    def make(kernels: Kernels) -> tuple[BatchedEstimator, SolveInputs]:
        est = BatchedEstimator(flow.decoder, 1, t, 10, kernels, conv_slots=2,
                               cache_dtype=cache_dtype)
        g = torch.Generator().manual_seed(2)
        s = SolveInputs(
            0,
            1,
            torch.randn(1, 80, 12, generator=g),
            torch.randn(1, 80, 12, generator=g),
            torch.randn(1, 80, 12, generator=g),
            torch.randn(1, 80, 12, generator=g),
            ix["write_pos"],
            torch.ones(2, 1, 1, t, dtype=torch.bool),
            ix["key_range"],
            torch.empty(0),
            torch.empty(0),
            PackedRows(ix["seg_first"], ix["cache_src"]),
        )
        return est, s

    return fused_vs_torch(_named("packed_solve", precision), make)


def main() -> None:
    _interpreter_scalar_loop_bounds()
    result = kernel_diffs(Kernels(fused=True), Kernels(fused=False))
    result.update(hift_diffs(Kernels(fused=True)))
    chosen = Kernels.for_device(torch.device("cpu"), wanted=True)  # runs its self-check
    result["self_check"] = chosen.self_check(torch.device("cpu")) if chosen.fused else -1.0
    result["chosen_under_tf32"] = chosen_under_tf32()
    for precision in PRECISIONS:
        result.update(solve_diffs(sys.argv[1], precision))
        result.update(packed_solve_diffs(sys.argv[1], precision))
    print(json.dumps(result))


def chosen_under_tf32() -> dict[str, bool]:
    """The start-up choice with ``allow_tf32`` on, where torch's matmuls round their operands
    to TF32 as CUDA's do (CPU matmuls ignore the flag, so the rounding is applied here)."""
    plain_attention = Kernels.attention

    def attention(self: Kernels, q, k, v, table, bias, key_range):  # type: ignore[no-untyped-def]
        if not self.fused and torch.backends.cuda.matmul.allow_tf32:
            q, k, v = (_tf32_round(t) for t in (q, k, v))
        return plain_attention(self, q, k, v, table, bias, key_range)

    Kernels.attention = attention  # type: ignore[method-assign]
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        chosen = Kernels.for_device(torch.device("cpu"), wanted=True)
        return {"fused": chosen.fused, "tf32_after": torch.backends.cuda.matmul.allow_tf32}
    finally:
        Kernels.attention = plain_attention  # type: ignore[method-assign]
        torch.backends.cuda.matmul.allow_tf32 = False


def _tf32_round(t: torch.Tensor) -> torch.Tensor:
    """fp32 values with the 13 low mantissa bits dropped, as a TF32 tensor core reads them."""
    bits = t.contiguous().view(torch.int32) & ~0x1FFF
    return bits.view(torch.float32)


if __name__ == "__main__":
    main()
