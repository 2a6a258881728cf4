"""The loader refuses bad checkpoints by file and key and keeps nothing half-loaded."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch
from minicpm_speech_runtime import assets
from minicpm_speech_runtime.assets import CheckpointError, load_code2wav


@pytest.fixture()
def copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, dst)
    return dst


def _flows_alive() -> int:
    gc.collect()
    from stepaudio2.cosyvoice2.flow.flow import CausalMaskedDiffWithXvec

    # type(), not isinstance(): isinstance asks a weakref proxy among the objects for its
    # referent's class, and a proxy whose referent is gone raises ReferenceError.
    return sum(issubclass(type(o), CausalMaskedDiffWithXvec) for o in gc.get_objects())


def test_loads_all_parts(models) -> None:  # type: ignore[no-untyped-def]
    assert models.up_rate == 2
    assert models.flow.input_embedding.num_embeddings == 6561
    assert not models.flow.training


@pytest.mark.parametrize("name", assets.FILES)
def test_missing_file_is_named(copy: Path, name: str) -> None:
    (copy / name).unlink()
    with pytest.raises(CheckpointError) as err:
        load_code2wav(copy)
    assert err.value.file == name


@pytest.mark.parametrize(
    "name", [assets.FLOW_PT, assets.HIFT_PT, assets.CAMPPLUS_ONNX, assets.TOKENIZER_ONNX]
)
def test_corrupt_file_is_named(copy: Path, name: str) -> None:
    data = (copy / name).read_bytes()
    (copy / name).write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError) as err:
        load_code2wav(copy)
    assert err.value.file == name


def test_mismatching_state_dict_names_first_key(copy: Path) -> None:
    state = torch.load(copy / assets.HIFT_PT, weights_only=True)
    first = next(iter(state))
    state[first] = torch.zeros(3)
    torch.save(state, copy / assets.HIFT_PT)
    with pytest.raises(CheckpointError) as err:
        load_code2wav(copy)
    assert (err.value.file, err.value.key) == (assets.HIFT_PT, first)


def test_extra_key_is_refused(copy: Path) -> None:
    state = torch.load(copy / assets.FLOW_PT, weights_only=True)
    state["surprise.weight"] = torch.zeros(1)
    torch.save(state, copy / assets.FLOW_PT)
    with pytest.raises(CheckpointError) as err:
        load_code2wav(copy)
    assert err.value.key == "surprise.weight"


def test_foreign_yaml_tag_is_refused(copy: Path) -> None:
    text = (copy / assets.FLOW_YAML).read_text()
    (copy / assets.FLOW_YAML).write_text(text + "boom: !apply:os.system ['true']\n")
    with pytest.raises(CheckpointError, match="not allowed"):
        load_code2wav(copy)


def test_nothing_half_loaded_stays(copy: Path, models) -> None:  # type: ignore[no-untyped-def]
    before = _flows_alive()
    (copy / assets.TOKENIZER_ONNX).write_bytes(b"garbage")  # fails after flow and hift loaded
    with pytest.raises(CheckpointError) as err:
        load_code2wav(copy)
    assert err.value.file == assets.TOKENIZER_ONNX
    assert _flows_alive() == before
