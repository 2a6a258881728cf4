"""Speaker-embedding backends for CAM++: torch on the device, ONNX Runtime, TensorRT.

All three read the same ``campplus.onnx``. The torch backend is the default on CUDA; ONNX Runtime
on the CPU (one intra-op thread, the serving default) stays selectable as the fallback; the
TensorRT backend exists only where the ``tensorrt`` package is importable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast

import numpy as np
import torch

from .campplus_graphs import CampPlusGraphs

BACKENDS = ("torch", "onnxruntime", "tensorrt")


class SpeakerBackend(Protocol):
    name: str

    def embed(self, fbank: torch.Tensor) -> torch.Tensor:
        """[1, T, 80] features (any device) -> [1, 192] float32 on the backend's output device."""
        ...


class TorchSpeaker:
    """CAM++ as a torch module; on CUDA through captured graphs when ``graphs`` is given."""

    name = "torch"

    def __init__(
        self, module: torch.nn.Module, device: torch.device, graphs: CampPlusGraphs | None = None
    ) -> None:
        self.module = module.to(device).eval()
        self.device = device
        self.graphs = graphs

    def _run(self, feats: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs(feats, lengths)
        return cast(torch.Tensor, self.module(feats, lengths))

    @torch.inference_mode()
    def embed(self, fbank: torch.Tensor) -> torch.Tensor:
        return self._run(fbank.to(self.device, non_blocking=True), None)

    @torch.inference_mode()
    def embed_batch(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """Embed several [T_i, 80] references at once (masked, zero-padded batch)."""
        lengths = torch.tensor([f.shape[0] for f in feats]).to(self.device, non_blocking=True)
        batch = torch.nn.utils.rnn.pad_sequence(
            [f.to(self.device, non_blocking=True) for f in feats], batch_first=True
        )
        return self._run(batch, lengths)


class OrtSpeaker:
    name = "onnxruntime"

    def __init__(self, onnx_path: Path, threads: int = 1) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name

    def embed(self, fbank: torch.Tensor) -> torch.Tensor:
        feats = fbank.detach().cpu().numpy()
        out = self.session.run(None, {self.input_name: feats})[0]
        return torch.from_numpy(np.ascontiguousarray(out))


def tensorrt_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None


class TensorRTSpeaker:
    """CAM++ through a TensorRT engine built from the same ONNX file (dynamic frames)."""

    name = "tensorrt"

    def __init__(self, onnx_path: Path, device: torch.device, max_frames: int = 3000) -> None:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(Path(onnx_path).read_bytes()):
            raise RuntimeError(f"TensorRT cannot parse {onnx_path}: {parser.get_error(0)}")
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        name = network.get_input(0).name
        profile.set_shape(name, (1, 50, 80), (1, 600, 80), (1, max_frames, 80))
        config.add_optimization_profile(profile)
        engine_bytes = builder.build_serialized_network(network, config)
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
        self.context = self.engine.create_execution_context()
        self.input_name, self.output_name = name, network.get_output(0).name
        self.device = device

    def embed(self, fbank: torch.Tensor) -> torch.Tensor:
        x = fbank.to(self.device, torch.float32).contiguous()
        out = torch.empty(x.shape[0], 192, device=self.device)
        self.context.set_input_shape(self.input_name, tuple(x.shape))
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        self.context.set_tensor_address(self.output_name, out.data_ptr())
        self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream)
        return out


def make_speaker(
    name: str,
    module: torch.nn.Module,
    onnx_path: Path,
    device: torch.device,
    cuda_graphs: bool = True,
) -> SpeakerBackend:
    """The named backend; ``torch`` on CUDA captures its graphs here, at start-up."""
    if name == "torch":
        graphs = None
        if cuda_graphs and device.type == "cuda":
            graphs = CampPlusGraphs(module.to(device).eval(), device)
            graphs.capture()
        return TorchSpeaker(module, device, graphs)
    if name == "onnxruntime":
        return OrtSpeaker(onnx_path)
    if name == "tensorrt":
        if not tensorrt_available():
            raise RuntimeError("the tensorrt backend needs the 'tensorrt' package")
        return TensorRTSpeaker(onnx_path, device)
    raise ValueError(f"unknown speaker backend {name!r}; choose one of {BACKENDS}")
