"""The ordered 64-request Seed-TTS subset: prepared, checked, and refused with names."""

from __future__ import annotations

import hashlib
import random
import wave
from pathlib import Path

import pytest
from minicpm_speech_perf import dataset
from minicpm_speech_perf.cli import main
from minicpm_speech_perf.dataset import DatasetError

SHARED_IDS = Path(__file__).resolve().parents[3] / "shared" / "data" / "seed-tts-en-eval-64.ids"


def tiny_wav(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes([seed % 256, 0]) * 800)


def full_tree(root: Path) -> list[str]:
    """A Seed-TTS-shaped copy: the 64 ids shuffled among other rows, one WAV per prompt."""
    ids = list(dataset.protocol_ids())
    rows = ids + [f"common_voice_en_9{i}-common_voice_en_8{i}" for i in range(20)]
    random.Random(7).shuffle(rows)
    lines = []
    for n, utt in enumerate(rows):
        prompt = utt.split("-")[0]
        rel = f"prompt-wavs/{prompt}.wav"
        if not (root / "en" / rel).exists():
            tiny_wav(root / "en" / rel, n)
        lines.append(f"{utt}|Prompt text {n}.|{rel}|Target text {n}, read aloud.")
    (root / "en" / "meta.lst").write_text("\n".join(lines) + "\n")
    return ids


def test_packaged_ids_are_the_protocol_subset() -> None:
    ids = dataset.protocol_ids()
    assert len(ids) == 64 and ids[0] == "common_voice_en_19724242-common_voice_en_19724243"
    assert len({i.split("-")[0] for i in ids}) == 63  # 63 distinct reference WAVs
    if SHARED_IDS.is_file():
        assert list(ids) == SHARED_IDS.read_text().split()


def test_prepare_writes_the_ids_in_order_and_check_passes(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    report = dataset.prepare(tmp_path / "src", tmp_path / "dst")
    rows = dataset.parse_meta(tmp_path / "dst" / "en" / "meta.lst")
    assert [r.utterance_id for r in rows] == ids
    assert (report.rows, report.distinct_wavs, report.hashes_checked) == (64, 63, 64)
    assert dataset.check(tmp_path / "dst").rows == 64


def test_missing_id_in_source_is_named(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    meta = tmp_path / "src" / "en" / "meta.lst"
    meta.write_text("".join(ln + "\n" for ln in meta.read_text().splitlines() if ids[5] not in ln))
    with pytest.raises(DatasetError, match=ids[5]):
        dataset.prepare(tmp_path / "src", tmp_path / "dst")


def test_missing_wav_names_id_and_path(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    dataset.prepare(tmp_path / "src", tmp_path / "dst")
    wav = tmp_path / "dst" / "en" / "prompt-wavs" / f"{ids[10].split('-')[0]}.wav"
    wav.unlink()
    with pytest.raises(DatasetError) as err:
        dataset.check(tmp_path / "dst")
    assert ids[10] in str(err.value) and str(wav) in str(err.value)


def test_hash_mismatch_names_id_and_path(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    dataset.prepare(tmp_path / "src", tmp_path / "dst")
    wav = tmp_path / "dst" / "en" / "prompt-wavs" / f"{ids[3].split('-')[0]}.wav"
    tiny_wav(wav, 99)  # same format, different bytes
    with pytest.raises(DatasetError, match="SHA-256 mismatch") as err:
        dataset.check(tmp_path / "dst")
    assert ids[3] in str(err.value) and str(wav) in str(err.value)


def test_explicit_hash_file_is_used(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    rel = f"prompt-wavs/{ids[0].split('-')[0]}.wav"
    digest = hashlib.sha256((tmp_path / "src" / "en" / rel).read_bytes()).hexdigest()
    sums = tmp_path / "sums.txt"
    sums.write_text(f"{digest}  {rel}\n")
    assert dataset.prepare(tmp_path / "src", tmp_path / "dst", hashes_file=sums).rows == 64
    sums.write_text(f"{'0' * 64}  {rel}\n")
    with pytest.raises(DatasetError, match=ids[0]):
        dataset.prepare(tmp_path / "src", tmp_path / "dst2", hashes_file=sums)


def test_wrong_order_or_extra_rows_are_refused(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    dataset.prepare(tmp_path / "src", tmp_path / "dst")
    meta = tmp_path / "dst" / "en" / "meta.lst"
    lines = meta.read_text().splitlines()
    lines[1], lines[2] = lines[2], lines[1]
    meta.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=f"row 2 is id {ids[2]}, expected id {ids[1]}"):
        dataset.check(tmp_path / "dst")
    lines[1], lines[2] = lines[2], lines[1]
    meta.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(DatasetError, match="63 rows, expected exactly 64"):
        dataset.check(tmp_path / "dst")


def test_malformed_meta_line_is_named(tmp_path: Path) -> None:
    meta = tmp_path / "en" / "meta.lst"
    meta.parent.mkdir(parents=True)
    meta.write_text("a|b|c|d\nbroken line\n")
    with pytest.raises(DatasetError, match=r"meta\.lst:2"):
        dataset.parse_meta(meta)


def test_corrupt_wav_is_named(tmp_path: Path) -> None:
    ids = full_tree(tmp_path / "src")
    dataset.prepare(tmp_path / "src", tmp_path / "dst")
    wav = tmp_path / "dst" / "en" / "prompt-wavs" / f"{ids[0].split('-')[0]}.wav"
    (tmp_path / "dst" / "en" / "SHA256SUMS").unlink()
    wav.write_bytes(b"not a wav at all")
    with pytest.raises(DatasetError, match="not a readable WAV") as err:
        dataset.check(tmp_path / "dst")
    assert ids[0] in str(err.value)


def test_cli_dataset_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full_tree(tmp_path / "src")
    assert main(["dataset", "prepare", "--source", str(tmp_path / "src"),
                 "--dest", str(tmp_path / "dst"), "--link"]) == 0  # fmt: skip
    assert '"rows": 64' in capsys.readouterr().out
    assert main(["dataset", "check", "--root", str(tmp_path / "dst")]) == 0
    capsys.readouterr()
    assert main(["dataset", "check", "--root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "perf-jobs dataset check: error:" in err
