"""Where the files shipped beside the code (CRD, profiles, examples) are found.

A wheel carries them under ``_assets`` (see pyproject's force-include); a source
checkout keeps them at the repository root, which stays their single source of truth.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_PACKAGED = _PACKAGE_DIR / "_assets"
_REPO_ROOT = _PACKAGE_DIR.parents[1]

_REPO_LOCATIONS = {
    "profiles": _REPO_ROOT / "profiles",
    "crds": _REPO_ROOT / "charts" / "minicpm-speech-operator" / "crds",
    "examples": _REPO_ROOT / "examples",
}


def asset_dir(kind: str) -> Path:
    """The directory holding one kind of asset: ``profiles``, ``crds`` or ``examples``."""
    if kind not in _REPO_LOCATIONS:
        raise KeyError(f"unknown asset kind {kind!r}; expected one of {sorted(_REPO_LOCATIONS)}")
    packaged = _PACKAGED / kind
    return packaged if packaged.is_dir() else _REPO_LOCATIONS[kind]


def crd_path() -> Path:
    return asset_dir("crds") / "minicpmspeeches.serving.minicpm-speech.io.yaml"
