"""CAM++ speaker embedding as a torch module, with weights read from ``campplus.onnx``.

The module is the 3D-Speaker CAM++ (80-bin fbank in, 192-d embedding out) in its exported,
inference-only form: every batch-norm that directly follows a convolution is folded into that
convolution's bias, the rest stay explicit. That is the form ONNX exports take, whatever their
initializer names (real exports name many of them anonymously, ``onnx::Conv_4372``), so weights
are matched by graph structure: the parameterised nodes of the graph, in topological order,
must match this module's slots one for one in operator, tensor shapes and convolution
attributes. Anything else (an unknown operator, a missing or extra layer, a shape or stride
that differs) raises :class:`CampPlusMappingError` naming the node.

``forward(feats, lengths)`` accepts a zero-padded batch of references of different lengths:
padded frames are re-zeroed after every layer and all time reductions are masked, so each row
equals the embedding of that reference alone, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FEAT_DIM = 80
EMBED_DIM = 192
_GROWTH, _BN_CHANNELS, _INIT_CHANNELS, _HEAD_CHANNELS = 32, 128, 128, 32
_BLOCKS = ((12, 1), (24, 2), (16, 2))  # (layers, dilation) of the three dense blocks
_SEG_LEN = 100

# Operators a CAM++ export may contain; the parameterised ones are Conv and BatchNormalization.
_ALLOWED_OPS = frozenset(
    [
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "Div",
        "Equal",
        "Expand",
        "Gather",
        "Identity",
        "Mul",
        "Reduce",
        "ReduceMean",
        "ReduceProd",
        "Relu",
        "Reshape",
        "Shape",
        "Sigmoid",
        "Slice",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Transpose",
        "Unsqueeze",
        "Where",
        "Add",
    ]
)


class CampPlusMappingError(ValueError):
    """``campplus.onnx`` does not have the structure this module was written for."""


class _Conv(nn.Module):
    """A convolution slot; always carries a bias (zero when the export had none)."""

    def __init__(self, conv: nn.Conv1d | nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.conv(x))


class _BatchNorm(nn.Module):
    """An inference batch-norm slot that could not be folded into a convolution."""

    weight: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("mean", torch.zeros(channels))
        self.register_buffer("var", torch.ones(channels))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.mean, self.var, self.weight, self.bias, False, 0.0, self.eps)


def _conv1d(cin: int, cout: int, k: int = 1, stride: int = 1, dil: int = 1) -> _Conv:
    pad = (k - 1) // 2 * dil
    return _Conv(nn.Conv1d(cin, cout, k, stride=stride, padding=pad, dilation=dil, bias=True))


def _conv2d(cin: int, cout: int, k: int, stride: tuple[int, int]) -> _Conv:
    return _Conv(nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=True))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean(-1, keepdim=True)
    return (x * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)


def _seg_pool(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Average over 100-frame segments, broadcast back to frames (ceil mode, masked)."""
    if mask is None:
        seg = F.avg_pool1d(x, _SEG_LEN, _SEG_LEN, ceil_mode=True)
        return seg.repeat_interleave(_SEG_LEN, dim=-1)[..., : x.shape[-1]]
    t = x.shape[-1]
    n_seg = -(-t // _SEG_LEN)
    pad = n_seg * _SEG_LEN - t
    # torch's ``Tensor.unflatten`` has no annotations
    sums: torch.Tensor = (
        F.pad(x * mask, (0, pad)).unflatten(-1, (n_seg, _SEG_LEN)).sum(-1)  # type: ignore[no-untyped-call]
    )
    counts: torch.Tensor = (
        F.pad(mask, (0, pad)).unflatten(-1, (n_seg, _SEG_LEN)).sum(-1).clamp(min=1.0)  # type: ignore[no-untyped-call]
    )
    return (sums / counts).repeat_interleave(_SEG_LEN, dim=-1)[..., :t]


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv2d(cin, cout, 3, (stride, 1))
        self.conv2 = _conv2d(cout, cout, 3, (1, 1))
        self.shortcut = _conv2d(cin, cout, 1, (stride, 1)) if stride != 1 or cin != cout else None

    def slots(self) -> list[nn.Module]:
        convs: list[nn.Module] = [self.conv1, self.conv2]
        return convs + ([self.shortcut] if self.shortcut else [])

    def forward(self, x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        out = _apply_mask(F.relu(self.conv1(x)), m)
        out = self.conv2(out)
        out = out + (self.shortcut(x) if self.shortcut is not None else x)
        return _apply_mask(F.relu(out), m)


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, dilation: int) -> None:
        super().__init__()
        self.bn_in = _BatchNorm(cin)
        self.linear1 = _conv1d(cin, _BN_CHANNELS)  # folded with the following batch-norm
        self.local = _conv1d(_BN_CHANNELS, _GROWTH, 3, dil=dilation)
        self.ctx1 = _conv1d(_BN_CHANNELS, _BN_CHANNELS // 2)
        self.ctx2 = _conv1d(_BN_CHANNELS // 2, _GROWTH)

    def slots(self) -> list[nn.Module]:
        return [self.bn_in, self.linear1, self.local, self.ctx1, self.ctx2]

    def forward(self, x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        h = _apply_mask(F.relu(self.linear1(F.relu(self.bn_in(x)))), m)
        y = self.local(h)
        context = _masked_mean(h, m) + _seg_pool(h, m)
        gate = torch.sigmoid(self.ctx2(F.relu(self.ctx1(context))))
        return _apply_mask(y * gate, m)


def _apply_mask(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    return x if m is None else x * m


class CampPlus(nn.Module):
    """CAM++ in folded inference form. ``forward(feats [B, T, 80], lengths [B] | None)``."""

    def __init__(self) -> None:
        super().__init__()
        c = _HEAD_CHANNELS
        self.head_conv1 = _conv2d(1, c, 3, (1, 1))
        self.head_blocks = nn.ModuleList(
            [_ResBlock(c, c, 2), _ResBlock(c, c, 1), _ResBlock(c, c, 2), _ResBlock(c, c, 1)]
        )
        self.head_conv2 = _conv2d(c, c, 3, (2, 1))
        self.tdnn = _conv1d(c * (FEAT_DIM // 8), _INIT_CHANNELS, 5, stride=2)
        channels = _INIT_CHANNELS
        self.blocks = nn.ModuleList()
        self.transit_bn = nn.ModuleList()
        self.transit = nn.ModuleList()
        for layers, dilation in _BLOCKS:
            block = nn.ModuleList(
                [_DenseLayer(channels + i * _GROWTH, dilation) for i in range(layers)]
            )
            self.blocks.append(block)
            channels += layers * _GROWTH
            self.transit_bn.append(_BatchNorm(channels))
            self.transit.append(_conv1d(channels, channels // 2))
            channels //= 2
        self.dense = _conv1d(channels * 2, EMBED_DIM)
        self.dense_bn = _BatchNorm(EMBED_DIM)

    def slots(self) -> list[nn.Module]:
        """Parameterised layers in the order the exported graph computes them."""
        out: list[nn.Module] = [self.head_conv1]
        for rb in cast("Iterable[_ResBlock]", self.head_blocks):
            out += rb.slots()
        out += [self.head_conv2, self.tdnn]
        blocks = cast("Iterable[Iterable[_DenseLayer]]", self.blocks)
        for block, bn, conv in zip(blocks, self.transit_bn, self.transit, strict=True):
            for layer in block:
                out += layer.slots()
            out += [bn, conv]
        return [*out, self.dense, self.dense_bn]

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        x = feats.permute(0, 2, 1).unsqueeze(1)  # [B, 1, F, T]
        m2 = (
            None
            if lengths is None
            else _time_mask(lengths, x.shape[-1]).view(-1, 1, 1, x.shape[-1])
        )
        x = _apply_mask(x, m2)
        x = _apply_mask(F.relu(self.head_conv1(x)), m2)
        for rb in self.head_blocks:
            x = rb(x, m2)
        x = _apply_mask(F.relu(self.head_conv2(x)), m2)
        x = x.flatten(1, 2)  # [B, C*F/8, T]
        t_lengths = None if lengths is None else (lengths - 1) // 2 + 1
        x = self.tdnn(x)
        m = None if t_lengths is None else _time_mask(t_lengths, x.shape[-1]).unsqueeze(1)
        x = _apply_mask(F.relu(x), m)
        blocks = cast("Iterable[Iterable[_DenseLayer]]", self.blocks)
        for block, bn, conv in zip(blocks, self.transit_bn, self.transit, strict=True):
            for layer in block:
                x = torch.cat([x, layer(x, m)], dim=1)
            x = _apply_mask(conv(F.relu(bn(x))), m)
        x = F.relu(x)
        stats = _stats_pool(x, m)
        return cast(torch.Tensor, self.dense_bn(self.dense(stats.unsqueeze(-1)).squeeze(-1)))


def _time_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    return (torch.arange(t, device=lengths.device)[None, :] < lengths[:, None]).float()


def _stats_pool(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    if m is None:
        return torch.cat([x.mean(-1), x.std(-1, unbiased=True)], dim=-1)
    n = m.sum(-1)
    mean = (x * m).sum(-1) / n
    var = (((x - mean.unsqueeze(-1)) ** 2) * m).sum(-1) / (n - 1)
    return torch.cat([mean, var.sqrt()], dim=-1)


# ----------------------------------------------------------------------------------------
# ONNX weight mapping


@dataclass(frozen=True, slots=True)
class _OnnxLayer:
    op: str
    name: str
    arrays: tuple[np.ndarray, ...]  # Conv: (W, B); BatchNormalization: (scale, B, mean, var)
    attrs: dict[str, object]


def _onnx_layers(path: Path) -> list[_OnnxLayer]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    layers: list[_OnnxLayer] = []
    produced_by_conv: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in _ALLOWED_OPS:
            raise CampPlusMappingError(f"node {node.name!r}: unexpected operator {node.op_type}")
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(attr.t)
            continue
        if node.op_type == "Identity" and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
            continue
        if node.op_type == "Conv":
            layers.append(_conv_layer(node, consts))
            produced_by_conv[node.output[0]] = len(layers) - 1
        elif node.op_type == "BatchNormalization":
            bn = _bn_layer(node, consts)
            src = produced_by_conv.get(node.input[0])
            if src is not None and consumers.get(node.input[0]) == 1:
                layers[src] = _fold(layers[src], bn)
            else:
                layers.append(bn)
    return layers


def _attrs(node: object) -> dict[str, object]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}  # type: ignore[attr-defined]


def _conv_layer(node: object, consts: dict[str, np.ndarray]) -> _OnnxLayer:
    inputs = list(node.input)  # type: ignore[attr-defined]
    name = node.name  # type: ignore[attr-defined]
    missing = [i for i in inputs[1:] if i not in consts]
    if missing:
        raise CampPlusMappingError(f"node {name!r}: weight {missing[0]!r} is not a constant")
    w = consts[inputs[1]].astype(np.float32)
    b = (
        consts[inputs[2]].astype(np.float32)
        if len(inputs) > 2
        else np.zeros(w.shape[0], np.float32)
    )
    attrs = _attrs(node)
    if int(cast(int, attrs.get("group", 1))) != 1:
        raise CampPlusMappingError(f"node {name!r}: grouped convolution")
    return _OnnxLayer("Conv", name, (w, b), attrs)


def _bn_layer(node: object, consts: dict[str, np.ndarray]) -> _OnnxLayer:
    inputs = list(node.input)  # type: ignore[attr-defined]
    name = node.name  # type: ignore[attr-defined]
    missing = [i for i in inputs[1:5] if i not in consts]
    if missing:
        raise CampPlusMappingError(f"node {name!r}: statistic {missing[0]!r} is not a constant")
    arrays = tuple(consts[i].astype(np.float32) for i in inputs[1:5])
    return _OnnxLayer("BatchNormalization", name, arrays, _attrs(node))


def _fold(conv: _OnnxLayer, bn: _OnnxLayer) -> _OnnxLayer:
    w, b = conv.arrays
    scale, shift, mean, var = (a.astype(np.float64) for a in bn.arrays)
    eps = float(bn.attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
    k = scale / np.sqrt(var + eps)
    shape = (-1,) + (1,) * (w.ndim - 1)
    w2 = (w.astype(np.float64) * k.reshape(shape)).astype(np.float32)
    b2 = ((b.astype(np.float64) - mean) * k + shift).astype(np.float32)
    return _OnnxLayer("Conv", conv.name, (w2, b2), conv.attrs)


def _expect_conv(slot: _Conv, layer: _OnnxLayer) -> None:
    conv = slot.conv
    if layer.op != "Conv":
        raise CampPlusMappingError(f"node {layer.name!r}: expected Conv, found {layer.op}")
    w, b = layer.arrays
    if tuple(w.shape) != tuple(conv.weight.shape):
        raise CampPlusMappingError(
            f"node {layer.name!r}: weight shape {tuple(w.shape)} != {tuple(conv.weight.shape)}"
        )
    nd = w.ndim - 2
    pads = [int(p) for p in conv.padding]
    # ONNX defaults when an attribute is absent: stride 1, dilation 1, no padding.
    defaults = {"strides": [1] * nd, "dilations": [1] * nd, "pads": [0] * (2 * nd)}
    want = {"strides": list(conv.stride), "dilations": list(conv.dilation), "pads": pads * 2}
    for key, value in want.items():
        got = [int(v) for v in layer.attrs.get(key, defaults[key])]  # type: ignore[attr-defined]
        if got != value:
            raise CampPlusMappingError(f"node {layer.name!r}: {key} {got} != {value}")
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w))
        conv.bias.copy_(torch.from_numpy(b))  # type: ignore[union-attr]


def _expect_bn(slot: _BatchNorm, layer: _OnnxLayer) -> None:
    if layer.op != "BatchNormalization":
        raise CampPlusMappingError(
            f"node {layer.name!r}: expected BatchNormalization, found {layer.op}"
        )
    scale, shift, mean, var = layer.arrays
    if scale.shape != tuple(slot.weight.shape):
        raise CampPlusMappingError(
            f"node {layer.name!r}: {scale.shape[0]} channels != {slot.weight.shape[0]}"
        )
    slot.eps = float(layer.attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
    for buf, arr in ((slot.weight, scale), (slot.bias, shift), (slot.mean, mean), (slot.var, var)):
        buf.copy_(torch.from_numpy(np.ascontiguousarray(arr)))


def load_campplus_onnx(path: str | Path) -> CampPlus:
    """Build a :class:`CampPlus` on the CPU with the weights of ``campplus.onnx``."""
    path = Path(path)
    layers = _onnx_layers(path)
    model = CampPlus()
    slots = model.slots()
    if len(layers) != len(slots):
        raise CampPlusMappingError(
            f"{path.name}: {len(layers)} parameterised layers, CAM++ has {len(slots)}"
        )
    for slot, layer in zip(slots, layers, strict=True):
        if isinstance(slot, _Conv):
            _expect_conv(slot, layer)
        else:
            assert isinstance(slot, _BatchNorm)
            _expect_bn(slot, layer)
    return model.eval()
