"""Every bundled profile ships in the wheel: pyproject names each file it copies."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_profile_and_the_schema_are_copied_into_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    copied = config["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    wanted = {f"profiles/{p.name}" for p in (ROOT / "profiles").iterdir()
              if p.suffix in (".yaml", ".json")}
    assert wanted <= set(copied), sorted(wanted - set(copied))
    for source in wanted:
        assert copied[source] == f"minicpm_speech_operator/_assets/{source}"
