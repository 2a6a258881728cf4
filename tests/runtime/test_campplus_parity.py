"""CAM++ as a torch module (weights mapped from the ONNX graph) vs ONNX Runtime on that file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from minicpm_speech_runtime.fixtures.synth import wav_bytes
from minicpm_speech_runtime.voice.campplus import CampPlusMappingError, load_campplus_onnx
from minicpm_speech_runtime.voice.host import prepare_host
from minicpm_speech_runtime.voice.speaker import OrtSpeaker, tensorrt_available

N_REFERENCES = 20


@pytest.fixture(scope="module")
def references() -> list[torch.Tensor]:
    rng = np.random.default_rng(11)
    feats = []
    for i in range(N_REFERENCES):
        seconds = float(rng.uniform(2.0, 10.0))
        rate = int(rng.choice([16000, 22050, 24000, 44100]))
        feats.append(prepare_host(wav_bytes(seconds, rate, seed=100 + i)).fbank)
    return feats


def _compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    cos = torch.nn.functional.cosine_similarity(a, b).min().item()
    norm_diff = ((a - b).abs().max() / b.abs().max()).item()
    return cos, norm_diff


@pytest.mark.parametrize("tf32", [False, True])
def test_torch_matches_onnxruntime(models, references, tf32: bool) -> None:  # type: ignore[no-untyped-def]
    # TF32 changes nothing on the CPU; the same test on CUDA is in the GPU benchmark script.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        ort = OrtSpeaker(models.campplus_onnx)
        with torch.inference_mode():
            for feats in references:
                cos, diff = _compare(models.campplus(feats), ort.embed(feats))
                assert cos >= 0.99999
                assert diff <= 1e-3
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_masked_batch_equals_single(models, references) -> None:  # type: ignore[no-untyped-def]
    feats = [f[0] for f in references[:6]]
    lengths = torch.tensor([f.shape[0] for f in feats])
    batch = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    with torch.inference_mode():
        together = models.campplus(batch, lengths)
        for i, f in enumerate(feats):
            cos, diff = _compare(together[i : i + 1], models.campplus(f[None]))
            assert cos >= 0.999999 and diff <= 1e-5


def _edit(src: Path, dst: Path, fn) -> Path:  # type: ignore[no-untyped-def]
    model = onnx.load(str(src))
    fn(model.graph)
    onnx.save(model, str(dst))
    return dst


def test_unknown_operator_is_refused(models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def swap(graph) -> None:  # type: ignore[no-untyped-def]
        node = next(n for n in graph.node if n.op_type == "Relu")
        node.op_type = "PRelu"

    bad = _edit(models.campplus_onnx, tmp_path / "c.onnx", swap)
    with pytest.raises(CampPlusMappingError, match="unexpected operator PRelu"):
        load_campplus_onnx(bad)


def test_shape_mismatch_names_the_node(models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def shrink(graph) -> None:  # type: ignore[no-untyped-def]
        node = next(n for n in graph.node if n.op_type == "Conv" and "tdnn" in n.name)
        init = next(i for i in graph.initializer if i.name == node.input[1])
        arr = onnx.numpy_helper.to_array(init)[:64]
        init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))

    bad = _edit(models.campplus_onnx, tmp_path / "c.onnx", shrink)
    with pytest.raises(CampPlusMappingError, match="tdnn"):
        load_campplus_onnx(bad)


def test_missing_layer_is_refused(models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def drop(graph) -> None:  # type: ignore[no-untyped-def]
        bn = [n for n in graph.node if n.op_type == "BatchNormalization"][3]
        nxt = [n for n in graph.node if bn.output[0] in n.input]
        for n in nxt:
            n.input[list(n.input).index(bn.output[0])] = bn.input[0]
        graph.node.remove(bn)

    bad = _edit(models.campplus_onnx, tmp_path / "c.onnx", drop)
    with pytest.raises(CampPlusMappingError):
        load_campplus_onnx(bad)


@pytest.mark.skipif(
    not tensorrt_available() or not torch.cuda.is_available(), reason="needs tensorrt and CUDA"
)
def test_tensorrt_matches_onnxruntime(models, references) -> None:  # type: ignore[no-untyped-def]
    from minicpm_speech_runtime.voice.speaker import TensorRTSpeaker

    trt = TensorRTSpeaker(models.campplus_onnx, torch.device("cuda"))
    ort = OrtSpeaker(models.campplus_onnx)
    for feats in references:
        cos, diff = _compare(trt.embed(feats).cpu(), ort.embed(feats))
        assert cos >= 0.99999 and diff <= 1e-3
