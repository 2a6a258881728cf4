"""The fixed, ordered Seed-TTS English subset the protocol measures with.

The official client reads `ROOT/en/meta.lst` (`utt_id|prompt_text|prompt_wav|target_text`),
skips rows whose prompt WAV is missing without failing, and takes the first N rows in file
order. So the subset only holds if `meta.lst` lists exactly the 64 ids, in order, and every
WAV is present: `prepare` writes such a tree from a full Seed-TTS copy, `check` proves it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

LOCALE = "en"
IDS_RESOURCE = "seed-tts-en-eval-64.ids"
HASHES_FILE = "SHA256SUMS"
_HEX = re.compile(r"^[0-9a-f]{64}$")


class DatasetError(ValueError):
    """The dataset does not match the protocol; the message names the id and path."""


@dataclass(frozen=True, slots=True)
class MetaRow:
    utterance_id: str
    prompt_text: str
    prompt_wav: str
    target_text: str

    def line(self) -> str:
        return "|".join((self.utterance_id, self.prompt_text, self.prompt_wav, self.target_text))


@dataclass(frozen=True, slots=True)
class DatasetReport:
    root: str
    rows: int
    distinct_wavs: int
    hashes_checked: int


def protocol_ids() -> tuple[str, ...]:
    """The 64 ids in protocol order, shipped inside the package."""
    text = resources.files("minicpm_speech_perf").joinpath("data", IDS_RESOURCE).read_text("utf-8")
    return parse_ids(text, IDS_RESOURCE)


def parse_ids(text: str, source: str) -> tuple[str, ...]:
    ids = tuple(line.strip() for line in text.splitlines() if line.strip())
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DatasetError(f"{source}: id {dupes[0]} listed more than once")
    return ids


def parse_meta(path: Path) -> list[MetaRow]:
    """meta.lst rows; a malformed line is an error here (the client would skip it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read meta.lst ({exc.strerror})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 4 or not parts[0] or not parts[2] or not parts[3]:
            raise DatasetError(f"{path}:{n}: expected utt_id|prompt_text|prompt_wav|target_text")
        rows.append(MetaRow(*parts))
    return rows


def parse_hashes(path: Path) -> dict[str, str]:
    """`sha256sum` output: `HEX  RELATIVE/PATH` per line, paths relative to the en/ dir."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        digest, _, rel = line.strip().partition(" ")
        rel = rel.strip().lstrip("*")
        if not _HEX.match(digest.lower()) or not rel:
            raise DatasetError(f"{path}:{n}: expected 'SHA256  relative/path'")
        out[os.path.normpath(rel)] = digest.lower()
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def select(rows: Sequence[MetaRow], ids: Sequence[str], source: Path) -> list[MetaRow]:
    """The rows of `ids`, in the order of `ids`."""
    by_id = {r.utterance_id: r for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise DatasetError(
            f"{source}: id {missing[0]} not found ({len(missing)} of the ids missing)"
        )
    return [by_id[i] for i in ids]


def check_wav(locale_dir: Path, row: MetaRow, hashes: dict[str, str]) -> bool:
    """Exists, is a readable non-empty WAV, and matches its hash when one is given."""
    path = locale_dir / row.prompt_wav
    if not path.is_file():
        raise DatasetError(f"id {row.utterance_id}: prompt WAV missing: {path}")
    try:
        with wave.open(str(path), "rb") as w:
            frames = w.getnframes()
    except (wave.Error, EOFError) as exc:
        raise DatasetError(f"id {row.utterance_id}: not a readable WAV: {path} ({exc})") from None
    if frames == 0:
        raise DatasetError(f"id {row.utterance_id}: WAV has no audio: {path}")
    expected = hashes.get(os.path.normpath(row.prompt_wav))
    if expected is None:
        return False
    if sha256(path) != expected:
        raise DatasetError(f"id {row.utterance_id}: SHA-256 mismatch: {path}")
    return True


def check(
    root: Path, ids: Sequence[str] | None = None, hashes_file: Path | None = None
) -> DatasetReport:
    """A prepared tree: meta.lst is exactly the ids in order, every WAV present and intact."""
    ids = tuple(ids) if ids is not None else protocol_ids()
    locale_dir = root / LOCALE
    rows = parse_meta(locale_dir / "meta.lst")
    got = [r.utterance_id for r in rows]
    for pos, (want, have) in enumerate(zip(ids, got, strict=False), start=1):
        if want != have:
            raise DatasetError(
                f"{locale_dir / 'meta.lst'}: row {pos} is id {have}, expected id {want}"
            )
    if len(got) != len(ids):
        raise DatasetError(
            f"{locale_dir / 'meta.lst'}: {len(got)} rows, expected exactly {len(ids)} "
            "(run `perf-jobs dataset prepare`)"
        )
    hashes = _hashes(locale_dir, hashes_file)
    checked = sum(check_wav(locale_dir, r, hashes) for r in rows)
    return DatasetReport(str(root), len(rows), len({r.prompt_wav for r in rows}), checked)


def _hashes(locale_dir: Path, hashes_file: Path | None) -> dict[str, str]:
    if hashes_file is not None:
        if not hashes_file.is_file():
            raise DatasetError(f"{hashes_file}: hash file not found")
        return parse_hashes(hashes_file)
    default = locale_dir / HASHES_FILE
    return parse_hashes(default) if default.is_file() else {}


def prepare(
    source: Path,
    dest: Path,
    ids: Sequence[str] | None = None,
    *,
    hashes_file: Path | None = None,
    link: bool = False,
) -> DatasetReport:
    """Write DEST/en/meta.lst with the ids in order and copy (or hard-link) their WAVs."""
    ids = tuple(ids) if ids is not None else protocol_ids()
    src_dir = source / LOCALE
    rows = select(parse_meta(src_dir / "meta.lst"), ids, src_dir / "meta.lst")
    hashes = _hashes(src_dir, hashes_file)
    for row in rows:
        check_wav(src_dir, row, hashes)
    dst_dir = dest / LOCALE
    dst_dir.mkdir(parents=True, exist_ok=True)
    kept: dict[str, str] = {}
    for row in rows:
        rel = os.path.normpath(row.prompt_wav)
        if rel.startswith("..") or os.path.isabs(rel):
            raise DatasetError(f"id {row.utterance_id}: WAV path leaves the dataset: {rel}")
        target = dst_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            (os.link if link else shutil.copyfile)(src_dir / rel, target)
        kept[rel] = sha256(target)
    (dst_dir / "meta.lst").write_text("".join(r.line() + "\n" for r in rows), encoding="utf-8")
    # The hashes of what was copied, so a later `check` detects a corrupted volume.
    (dst_dir / HASHES_FILE).write_text(
        "".join(f"{h}  {p}\n" for p, h in sorted(kept.items())), encoding="utf-8"
    )
    return check(dest, ids)
