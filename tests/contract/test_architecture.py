"""The README's picture of the parts and their arrows is the code's import graph.

The picture is a Mermaid graph in the README's "Architecture" section; each arrow ``a --> b``
says that some module of part ``a`` imports one of part ``b``. The test builds the import
graph of the installed packages and holds the picture to it both ways: an arrow the code does
not have, or an import the picture does not show, fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import grimp

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = "<!-- parts and arrows -->"
# Part name in the picture -> the module prefixes it covers; the longest prefix wins.
PARTS = {
    "contract": ("minicpm_speech_contract",),
    "operator": ("minicpm_speech_operator",),
    "emulator": ("minicpm_speech_emulator",),
    "perf_job": ("minicpm_speech_perf",),
    "engine": ("minicpm_speech_runtime.engine",),
    "serving": ("minicpm_speech_runtime.serving",),
    "benches": ("minicpm_speech_runtime.bench",),
    "voice": ("minicpm_speech_runtime.voice",),
    "fixtures": ("minicpm_speech_runtime.fixtures",),
    "models": ("minicpm_speech_runtime",),
}
ARROW = re.compile(r"^\s*(\w+)\s*-->(?:\|[^|]*\|)?\s*(\w+)\s*$")


def pictured() -> tuple[set[str], set[tuple[str, str]]]:
    text = README.read_text(encoding="utf-8")
    assert MARK in text, f"README.md has no {MARK} block"
    block = text.split(MARK, 1)[1].split("```mermaid", 1)[1].split("```", 1)[0]
    arrows = {(m[1], m[2]) for line in block.splitlines() if (m := ARROW.match(line))}
    nodes = set(re.findall(r"^\s*(\w+)\[", block, flags=re.M))
    return nodes, arrows


def part_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for part, prefixes in PARTS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                    best is None or len(prefix) > best[0]):
                best = (len(prefix), part)
    return best[1] if best else None


def imported() -> tuple[set[str], set[tuple[str, str]]]:
    packages = sorted({p[0].split(".")[0] for p in PARTS.values()})
    present = [p for p in packages if _importable(p)]
    graph = grimp.build_graph(*present)
    parts, arrows = set(), set()
    for module in graph.modules:
        source = part_of(module)
        if source is None:
            continue
        parts.add(source)
        for target_module in graph.find_modules_directly_imported_by(module):
            target = part_of(target_module)
            if target is not None and target != source:
                arrows.add((source, target))
    return parts, arrows


def _importable(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def test_the_readme_draws_every_import_between_parts_and_no_other() -> None:
    nodes, drawn = pictured()
    parts, code = imported()
    assert nodes == parts, f"parts drawn {sorted(nodes)}, in the code {sorted(parts)}"
    assert sorted(drawn - code) == [], "arrows drawn that the code does not have"
    assert sorted(code - drawn) == [], "imports the picture does not show"
