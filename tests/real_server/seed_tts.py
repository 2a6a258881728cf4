"""A Seed-TTS-format folder for the perf Jobs' client in the real-server lane.

``vllm bench serve --omni --dataset-name seed-tts`` reads ``en/meta.lst`` (one
``id|reference text|reference WAV|target text`` row per request, in order) and sends each
row's reference WAV in the body's ``ref_audio``. The published runs read the 64-row subset of
Seed-TTS's English test set; this folder has the same layout with a few rows whose reference
voices espeak-ng speaks here, so nothing is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROWS = (
    ("lane_0001", "The weather is clear this morning.", "Please read the report before noon."),
    ("lane_0002", "Our train leaves at seven.", "The garden needs water every evening."),
    ("lane_0003", "She painted the door bright green.", "Bring two pencils and a notebook."),
    ("lane_0004", "A small boat crossed the river.", "The meeting starts in ten minutes."),
)


def write_seed_tts(root: Path, rows: tuple[tuple[str, str, str], ...] = ROWS) -> Path:
    """Write ``root/en/meta.lst`` and its reference WAVs; returns ``root``."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise RuntimeError("espeak-ng is not installed: apt-get install -y espeak-ng")
    wavs = root / "en" / "prompt-wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    lines = []
    for utt, reference, target in rows:
        wav = wavs / f"{utt}.wav"
        subprocess.run([espeak, "-v", "en-us", "-s", "150", "-w", str(wav), reference],
                       check=True, capture_output=True)  # fmt: skip
        lines.append(f"{utt}|{reference}|prompt-wavs/{wav.name}|{target}")
    (root / "en" / "meta.lst").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
