"""Write random-weight Code2Wav checkpoints in the released folder layout.

The layout is the one the reference ``stepaudio2.Token2wav`` reads: ``flow.yaml`` (hyperpyyaml,
``!new:cosyvoice2...`` tags), ``flow.pt`` and ``hift.pt`` (state dicts), ``campplus.onnx`` and
``speech_tokenizer_v2_25hz.onnx``. Tests and benchmarks load what this writes through
:func:`minicpm_speech_runtime.assets.load_code2wav`, the loader users run on real weights.

``REAL`` holds the released dimensions. They come from the reference code's fixed shapes and
the public checkpoint: the flow settings are those of the released ``flow.yaml`` (also checked
field by field by vLLM-Omni's native Token2Wav contract); HiFT is the reference's default
constructor (``Token2wav`` builds ``HiFTGenerator()`` with no arguments); the S3 tokenizer v2 is
``s3tokenizer``'s default config (1280 wide, 6 layers); CAM++ is the 3D-Speaker model with
80-bin input and 192-d output, the shape of the released ``campplus.onnx``. At random init
these give flow 155.8 M parameters (encoder 37.8 M, DiT 114.6 M) and HiFT 20.8 M.

``TINY`` shrinks what the loader can shrink (flow widths and depths, tokenizer width and depth)
for CPU tests; HiFT, CAM++ and the token/mel interfaces keep their real shapes because the
reference hard-codes them.

Usage: ``python -m minicpm_speech_runtime.checkpoint OUT_DIR [--real] [--seed N]``.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from . import assets


@dataclass(frozen=True, slots=True)
class Dims:
    """Shrinkable dimensions of a Code2Wav checkpoint."""

    width: int  # token embedding, encoder width
    encoder_heads: int
    encoder_ffn: int
    encoder_blocks: int
    encoder_up_blocks: int
    dit_hidden: int
    dit_depth: int
    dit_heads: int
    dit_head_dim: int
    dit_mlp_ratio: float
    tokenizer_width: int
    tokenizer_layers: int


REAL = Dims(512, 8, 2048, 6, 4, 512, 16, 8, 64, 4.0, 1280, 6)
TINY = Dims(64, 2, 128, 1, 1, 64, 1, 2, 32, 2.0, 128, 1)

_FLOW_YAML = """\
# Code2Wav flow: token embedding -> UpsampleConformerEncoderV2 -> causal DiT (CFM, 10 steps)
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: {d.width}
    output_size: 80
    spk_embed_dim: 192
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: {d.width}
        output_size: {d.width}
        input_layer: 'linear'
        pre_lookahead_len: 3
        num_blocks: {d.encoder_blocks}
        num_up_blocks: {d.encoder_up_blocks}
        up_stride: 2
        up_scale_factor: 2
        attention_heads: {d.encoder_heads}
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        key_bias: true
        linear_units: {d.encoder_ffn}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: true
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
            mlp_ratio: {d.dit_mlp_ratio}
            depth: {d.dit_depth}
            num_heads: {d.dit_heads}
            head_dim: {d.dit_head_dim}
            hidden_size: {d.dit_hidden}
"""


def flow_yaml(dims: Dims) -> str:
    return _FLOW_YAML.format(d=dims)


def _randomise_(module: torch.nn.Module, generator: torch.Generator) -> None:
    # Zero-initialised parameters (adaLN gates, biases) would make parts of the network
    # constant; small random values keep every path live.
    with torch.no_grad():
        for p in module.parameters():
            if torch.count_nonzero(p) == 0:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)


def write_flow(folder: Path, dims: Dims, seed: int) -> None:
    text = flow_yaml(dims)
    (folder / assets.FLOW_YAML).write_text(text)
    torch.manual_seed(seed)
    flow = assets.build_flow(folder / assets.FLOW_YAML)
    _randomise_(flow, torch.Generator().manual_seed(seed))
    torch.save(flow.state_dict(), folder / assets.FLOW_PT)


def write_hift(folder: Path, seed: int) -> None:
    from stepaudio2.flashcosyvoice.modules.hifigan import HiFTGenerator

    torch.manual_seed(seed + 1)
    torch.save(HiFTGenerator().state_dict(), folder / assets.HIFT_PT)


def write_campplus(folder: Path, seed: int) -> None:
    """Export the open 3D-Speaker CAM++ with random weights and calibrated statistics."""
    from speakerlab.models.campplus.DTDNN import CAMPPlus

    torch.manual_seed(seed + 2)
    model = CAMPPlus(feat_dim=80, embedding_size=192)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.affine:
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0.0, 0.1)
            if isinstance(mod, torch.nn.Conv1d) and mod.bias is not None:
                mod.bias.normal_(0.0, 0.1)
        # Batch statistics from fbank-like inputs keep activations in a realistic range.
        model.train()
        for _ in range(3):
            model(torch.randn(4, 300, 80) * 3.0)
    model.eval()
    torch.onnx.export(
        model,
        (torch.randn(1, 200, 80),),
        str(folder / assets.CAMPPLUS_ONNX),
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch", 1: "frames"}, "output": {0: "batch"}},
        opset_version=17,
        do_constant_folding=True,
        dynamo=False,  # the TorchScript exporter folds batch-norms as released exports do
    )


def write_random_checkpoint(
    folder: str | Path, dims: Dims = TINY, seed: int = 0, campplus_onnx: Path | None = None
) -> Path:
    """Write all five files of a random-weight Code2Wav checkpoint into ``folder``.

    ``campplus_onnx`` reuses an exported CAM++ file instead of exporting one (machines whose
    torch lacks the TorchScript ONNX exporter or ``speakerlab``).
    """
    from .s3onnx import write_random_tokenizer_onnx

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_flow(out, dims, seed)
    write_hift(out, seed)
    if campplus_onnx is not None:
        shutil.copyfile(campplus_onnx, out / assets.CAMPPLUS_ONNX)
    else:
        write_campplus(out, seed)
    write_random_tokenizer_onnx(
        out / assets.TOKENIZER_ONNX, dims.tokenizer_width, dims.tokenizer_layers, seed + 3
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--real", action="store_true", help="released dimensions (GPU benchmarks)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_random_checkpoint(args.out, REAL if args.real else TINY, args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
