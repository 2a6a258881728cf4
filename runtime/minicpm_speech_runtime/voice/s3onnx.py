"""The S3 speech tokenizer v2 (25 Hz) file: read its dimensions, write random-weight copies.

The reference loads ``speech_tokenizer_v2_25hz.onnx`` with ``s3tokenizer.onnx2torch``, which
never runs the graph: it walks the nodes and names each weight after the node that consumes it
(``/blocks.0/attn/query/MatMul`` -> ``encoder.blocks.0.attn.query.weight``), with a few
anonymous initializers of the real export named by fixed ids (``onnx::Conv_2216`` is conv1's
weight). :func:`write_random_tokenizer_onnx` writes a file in exactly that naming, so the same
converter loads it. The graph in it is a weight container: each node consumes the graph input
and one weight, so it is well-formed ONNX but does not compute the tokenizer.

Dimensions are inferred from the weights: width from conv1, mel bins from conv1's input,
depth from the block count, and heads as width / 64 (the rotary tables of ``S3TokenizerV2`` are
built for 64-wide heads; the released model is 1280 wide with 20 heads).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

TOKENIZER_NAME = "speech_tokenizer_v2_25hz"
HEAD_DIM = 64

# Anonymous initializer ids of the released v2 export that the converter maps by name.
_FIXED_NAMES = {
    "encoder.conv1.weight": "onnx::Conv_2216",
    "encoder.conv1.bias": "onnx::Conv_2217",
    "encoder.conv2.weight": "onnx::Conv_2218",
    "encoder.conv2.bias": "onnx::Conv_2219",
    "quantizer._codebook.project_down.weight": "onnx::MatMul_2536",
    "quantizer._codebook.project_down.bias": "quantizer.project_in.bias",
}
_BLOCK_KEY = re.compile(r"encoder\.blocks\.(\d+)\.(.+)\.(weight|bias)$")


def tokenizer_config(state: dict[str, torch.Tensor]) -> Any:
    """The ``s3tokenizer`` ``ModelConfig`` that fits a converted state dict."""
    from s3tokenizer.model_v2 import ModelConfig

    conv1 = state["encoder.conv1.weight"]
    n_state, n_mels = int(conv1.shape[0]), int(conv1.shape[1])
    blocks = {int(m.group(1)) for k in state if (m := _BLOCK_KEY.match(k))}
    if n_state % HEAD_DIM:
        raise ValueError(f"tokenizer width {n_state} is not a multiple of {HEAD_DIM}")
    return ModelConfig(
        n_mels=n_mels,
        n_audio_state=n_state,
        n_audio_head=n_state // HEAD_DIM,
        n_audio_layer=len(blocks),
        n_codebook_size=3**8,
    )


def _node_name(key: str) -> tuple[str, str]:
    """(node name, op type) whose consumption the converter maps back to ``key``."""
    m = _BLOCK_KEY.match(key)
    if m is None:
        raise ValueError(f"unexpected tokenizer weight {key}")
    block, path, kind = m.groups()
    parts = path.split(".")
    if parts[-1] in ("attn_ln", "mlp_ln"):
        return f"/blocks.{block}/{parts[-1]}/LayerNormalization", "LayerNormalization"
    if parts[-1] == "fsmn_block":
        return f"/blocks.{block}/attn/fsmn_block/Conv", "Conv"
    if parts[0] == "mlp":
        scope = f"/blocks.{block}/mlp/mlp.{parts[1]}"
    else:
        scope = f"/blocks.{block}/" + "/".join(parts)
    return (f"{scope}/MatMul", "MatMul") if kind == "weight" else (f"{scope}/Add", "Add")


def write_random_tokenizer_onnx(
    path: str | Path, n_state: int = 1280, n_layer: int = 6, seed: int = 0
) -> None:
    """Write a random-weight tokenizer file that ``s3tokenizer.onnx2torch`` loads."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from s3tokenizer.model_v2 import ModelConfig, S3TokenizerV2

    torch.manual_seed(seed)
    cfg = ModelConfig(
        n_audio_state=n_state, n_audio_head=n_state // HEAD_DIM, n_audio_layer=n_layer
    )
    state = S3TokenizerV2(TOKENIZER_NAME, cfg).state_dict()
    inits, nodes, outputs = [], [], []
    ln_pending: dict[str, dict[str, str]] = {}
    for i, (key, value) in enumerate(state.items()):
        array = value.detach().float().numpy()
        if array.ndim == 2:  # the converter transposes every 2-D weight back
            array = np.ascontiguousarray(array.T)
        if key in _FIXED_NAMES:
            name = _FIXED_NAMES[key]
            inits.append(numpy_helper.from_array(array, name))
            op = "MatMul" if "MatMul" in name else ("Add" if "bias" in name else "Conv")
            out = f"out_{i}"
            nodes.append(helper.make_node(op, ["x", name], [out], name=f"/fixed_{i}"))
            outputs.append(out)
            continue
        node_name, op = _node_name(key)
        init_name = f"w{i}_{key}"
        inits.append(numpy_helper.from_array(array, init_name))
        if op == "LayerNormalization":
            ln_pending.setdefault(node_name, {})[key.rsplit(".", 1)[1]] = init_name
            continue
        out = f"out_{i}"
        nodes.append(helper.make_node(op, ["x", init_name], [out], name=node_name))
        outputs.append(out)
    for node_name, parts in ln_pending.items():
        out = f"out_{node_name}"
        nodes.append(
            helper.make_node(
                "LayerNormalization", ["x", parts["weight"], parts["bias"]], [out], name=node_name
            )
        )
        outputs.append(out)
    graph = helper.make_graph(
        nodes,
        TOKENIZER_NAME,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
