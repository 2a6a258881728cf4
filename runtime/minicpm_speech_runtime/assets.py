"""Load a Code2Wav checkpoint folder with the reference package's architecture classes.

A folder holds ``flow.yaml``, ``flow.pt``, ``hift.pt``, ``campplus.onnx`` and
``speech_tokenizer_v2_25hz.onnx``. Everything is read and checked on the CPU first and moved to
the device only when all five parts loaded; a missing or corrupt file, or a state dict that does
not match its module, raises :class:`CheckpointError` naming the file and the first mismatching
key, after every partly built module has been dropped.

``flow.yaml`` is hyperpyyaml, whose ``!new:`` tags construct arbitrary Python objects, so its
tags are checked against the four ``cosyvoice2`` classes of the released file before it is
evaluated.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import yaml
from torch import nn

T = TypeVar("T")

FLOW_YAML = "flow.yaml"
FLOW_PT = "flow.pt"
HIFT_PT = "hift.pt"
CAMPPLUS_ONNX = "campplus.onnx"
TOKENIZER_ONNX = "speech_tokenizer_v2_25hz.onnx"
FILES = (FLOW_YAML, FLOW_PT, HIFT_PT, CAMPPLUS_ONNX, TOKENIZER_ONNX)

ALLOWED_TAGS = frozenset(
    {
        "!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec",
        "!new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2",
        "!new:cosyvoice2.flow.flow_matching.CausalConditionalCFM",
        "!new:cosyvoice2.flow.decoder_dit.DiT",
    }
)


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used; names the file and, if any, the key."""

    def __init__(self, file: str, detail: str, key: str | None = None) -> None:
        where = f"{file} [{key}]" if key else file
        super().__init__(f"{where}: {detail}")
        self.file, self.key, self.detail = file, key, detail


@dataclass(slots=True)
class Code2WavModels:
    """The loaded modules of one checkpoint, in eval mode on ``device``."""

    folder: Path
    device: torch.device
    flow: nn.Module
    hift: nn.Module
    tokenizer: nn.Module
    campplus: nn.Module  # the torch CAM++ (weights from campplus.onnx), on ``device``

    @property
    def campplus_onnx(self) -> Path:
        return self.folder / CAMPPLUS_ONNX

    @property
    def up_rate(self) -> int:
        return int(self.flow.up_rate)  # type: ignore[arg-type]


def check_flow_yaml(path: Path) -> None:
    """Refuse a ``flow.yaml`` that is not YAML or constructs anything but the flow classes."""
    try:
        root = yaml.compose(path.read_text())
    except yaml.YAMLError as exc:
        raise CheckpointError(path.name, f"not valid YAML: {exc}") from None
    if not isinstance(root, yaml.MappingNode):
        raise CheckpointError(path.name, "top level is not a mapping")
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        if node.tag.startswith("!") and node.tag not in ALLOWED_TAGS:
            raise CheckpointError(path.name, f"tag {node.tag} is not allowed")
        if isinstance(node, yaml.MappingNode):
            stack.extend(v for pair in node.value for v in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    keys = {k.value for k, _ in root.value}
    if "flow" not in keys:
        raise CheckpointError(path.name, "no 'flow' entry")


def ensure_cosyvoice2_alias() -> None:
    """Make ``cosyvoice2.*``, the module flow.yaml names its classes by, importable: the
    reference package (stepaudio2-minicpmo) provides it as an alias of its own modules."""
    from stepaudio2.token2wav import _setup_cosyvoice2_alias

    _setup_cosyvoice2_alias()


def build_flow(yaml_path: Path) -> nn.Module:
    """Construct the (randomly initialised) flow that ``flow.yaml`` describes."""
    from hyperpyyaml import load_hyperpyyaml

    check_flow_yaml(yaml_path)
    ensure_cosyvoice2_alias()
    with yaml_path.open() as f:
        try:
            flow = load_hyperpyyaml(f)["flow"]
        except Exception as exc:  # constructor errors carry the offending setting
            raise CheckpointError(yaml_path.name, f"cannot build the flow: {exc}") from None
    if not isinstance(flow, nn.Module):
        raise CheckpointError(yaml_path.name, "'flow' is not a module")
    return flow


def read_checkpoint_file(path: Path, reader: Callable[[Path], T]) -> T:
    """``reader(path)``; a missing file or a failed read is refused naming the file."""
    if not path.is_file():
        raise CheckpointError(path.name, "missing")
    try:
        return reader(path)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(path.name, f"corrupt or unreadable: {exc!r}") from None


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    state = read_checkpoint_file(
        path, lambda p: torch.load(p, map_location="cpu", weights_only=True)
    )
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(path.name, "not a state dict of tensors")
    return state


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], file: str) -> None:
    """``load_state_dict(strict=True)`` with an error that names the first bad key."""
    own = module.state_dict()
    for key, value in own.items():
        if key not in state:
            raise CheckpointError(file, "missing from the file", key)
        if tuple(state[key].shape) != tuple(value.shape):
            raise CheckpointError(
                file, f"shape {tuple(state[key].shape)} != {tuple(value.shape)}", key
            )
    for key in state:
        if key not in own:
            raise CheckpointError(file, "not a parameter of the module", key)
    module.load_state_dict(state, strict=True)


def _load_flow(folder: Path) -> nn.Module:
    yaml_path = folder / FLOW_YAML
    if not yaml_path.is_file():
        raise CheckpointError(FLOW_YAML, "missing")
    flow = build_flow(yaml_path)
    load_strict(flow, read_state_dict(folder / FLOW_PT), FLOW_PT)
    return flow


def _load_hift(folder: Path) -> nn.Module:
    from stepaudio2.flashcosyvoice.modules.hifigan import HiFTGenerator

    state = read_state_dict(folder / HIFT_PT)
    state = {k.replace("generator.", ""): v for k, v in state.items()}
    hift: nn.Module = HiFTGenerator()
    load_strict(hift, state, HIFT_PT)
    return hift


def _load_tokenizer(folder: Path) -> nn.Module:
    import s3tokenizer
    from s3tokenizer.model_v2 import S3TokenizerV2

    from .voice.s3onnx import TOKENIZER_NAME, tokenizer_config

    def read(path: Path) -> tuple[dict[str, Any], Any]:
        state = s3tokenizer.onnx2torch(str(path), None, False)
        return state, tokenizer_config(state)

    state, config = read_checkpoint_file(folder / TOKENIZER_ONNX, read)
    tokenizer: nn.Module = S3TokenizerV2(TOKENIZER_NAME, config)
    load_strict(tokenizer, state, TOKENIZER_ONNX)
    return tokenizer


def _load_campplus(folder: Path) -> nn.Module:
    from .voice.campplus import CampPlusMappingError, load_campplus_onnx

    def load(path: Path) -> nn.Module:
        try:
            return load_campplus_onnx(path)
        except CampPlusMappingError as exc:
            raise CheckpointError(CAMPPLUS_ONNX, str(exc)) from None

    return read_checkpoint_file(folder / CAMPPLUS_ONNX, load)


def load_code2wav(folder: str | Path, device: str | torch.device = "cpu") -> Code2WavModels:
    """Load all five parts of a Code2Wav checkpoint, or none of them."""
    root = Path(folder)
    parts: dict[str, Any] = {}
    failure: CheckpointError | None = None
    try:
        parts["flow"] = _load_flow(root)
        parts["hift"] = _load_hift(root)
        parts["tokenizer"] = _load_tokenizer(root)
        parts["campplus"] = _load_campplus(root)
    except CheckpointError as exc:
        # Re-raised outside this block so its traceback (and the frames holding the
        # half-built modules) is gone before the caller sees the error.
        failure = CheckpointError(exc.file, exc.detail, exc.key)
    if failure is not None:
        parts.clear()
        gc.collect()
        raise failure
    dev = torch.device(device)
    return Code2WavModels(
        folder=root,
        device=dev,
        **{name: module.to(dev).eval() for name, module in parts.items()},
    )


REFERENCE_STREAM_CACHES = ("att_cache_buffer", "cnn_cache_buffer")


def drop_reference_stream_caches(flow: nn.Module) -> int:
    """Free the streaming caches the reference's CFM and DiT allocate at construction (one fixed
    buffer each, 2.1 GB at the released shapes); the batched engine keeps its own caches and
    never reads them. Returns the bytes freed. Only for a flow the reference will not stream."""
    freed = 0
    decoder = flow.get_submodule("decoder")
    for module in (decoder, decoder.get_submodule("estimator")):
        for name in REFERENCE_STREAM_CACHES:
            buf = module._buffers.get(name)
            if buf is not None and buf.numel():
                freed += buf.numel() * buf.element_size()
                module._buffers[name] = buf.new_zeros(0)
    return freed
