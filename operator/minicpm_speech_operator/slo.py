"""spec.slo and spec.profile.search: the targets a configuration must meet, and the candidates
the operator may choose among to meet them.

The figures an SLO names are the ones the perf Jobs already publish (status.perf): audio
throughput and p95 time to first audio at one sweep concurrency, and the quality run's WER
and speaker similarity at C8. The search itself, a pure decision over the Jobs the cluster
holds, is :mod:`.perf.search`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minicpm_speech_contract.extras import EXTRA_PATH, PRECISIONS

from .errors import InvalidSpec, refuse_repeats

# Each grid key of spec.profile.search.grid, and the profile override one of its values makes.
GRID_KEYS = ("stage2MaxNumSeqs", "microBatchSize", "precision", "solverSteps")
GRID_EXTRAS = {"microBatchSize": "micro_batch_size", "precision": "token2wav_precision",
               "solverSteps": "token2wav_n_timesteps"}


def grid_override(key: str, value: Any) -> dict[str, Any]:
    if key == "stage2MaxNumSeqs":
        return {"stages": [{"stage_id": 2, "max_num_seqs": value}]}
    extra = GRID_EXTRAS[key]
    override: dict[str, Any] = {extra: value}
    for part in reversed(EXTRA_PATH):
        override = {part: override}
    return override


@dataclass(frozen=True, slots=True)
class Slo:
    concurrency: int
    first_audio_p95_ms: float | None
    min_audio_seconds_per_second: float | None
    max_wer_delta_points: float | None
    min_sim: float | None


@dataclass(frozen=True, slots=True)
class Search:
    enabled: bool
    profiles: tuple[str, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]  # (grid key, its values), in GRID_KEYS order
    max_candidates: int
    max_gpu_minutes: int

    def combinations(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every combination of the grid's values, ((key, value), ...); one empty one
        without a grid."""
        keys = [key for key, _ in self.grid]
        return [tuple(zip(keys, values, strict=True))
                for values in itertools.product(*(values for _, values in self.grid))]

    @property
    def num_candidates(self) -> int:
        """The spec's own profile, then each listed profile with each grid combination."""
        return 1 + len(self.profiles) * len(self.combinations())


def _number(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    return float(value) if value is not None else None


def parse_slo(raw: Mapping[str, Any] | None) -> Slo | None:
    if raw is None:
        return None
    return Slo(
        concurrency=raw["concurrency"],
        first_audio_p95_ms=_number(raw, "firstAudioP95Ms"),
        min_audio_seconds_per_second=_number(raw, "minAudioSecondsPerSecond"),
        max_wer_delta_points=_number(raw, "maxWerDeltaPoints"),
        min_sim=_number(raw, "minSim"),
    )


def parse_search(raw: Mapping[str, Any]) -> Search:
    """From the defaulted spec: the CRD holds every default."""
    grid = raw.get("grid") or {}
    return Search(
        enabled=raw["enabled"],
        profiles=tuple(raw["profiles"]),
        grid=tuple((key, tuple(grid[key])) for key in GRID_KEYS if grid.get(key)),
        max_candidates=raw["maxCandidates"],
        max_gpu_minutes=raw["maxGpuMinutes"],
    )


def check_slo(slo: Slo | None, concurrencies: tuple[int, ...]) -> None:
    """The CRD's CEL rules on spec.slo, checked here too (an older API server, a dry run or
    the emulator may not evaluate them); checked while perf is off as well."""
    if slo is None:
        return
    targets = (slo.first_audio_p95_ms, slo.min_audio_seconds_per_second,
               slo.max_wer_delta_points, slo.min_sim)
    if all(target is None for target in targets):
        raise InvalidSpec("spec.slo", "sets no target", "Set at least one of firstAudioP95Ms, "
                          "minAudioSecondsPerSecond, maxWerDeltaPoints or minSim")
    if slo.concurrency not in concurrencies:
        raise InvalidSpec(
            "spec.slo.concurrency",
            f"{slo.concurrency} is not measured: spec.perf.concurrencies is {list(concurrencies)}",
            "Pick one of spec.perf.concurrencies, or add it there")


def check_search(search: Search, slo: Slo | None, perf_enabled: bool, placement: str,
                 bundled: tuple[str, ...]) -> None:
    field = "spec.profile.search"
    refuse_repeats(f"{field}.profiles", search.profiles)
    for key, values in search.grid:
        refuse_repeats(f"{field}.grid.{key}", values)
    for i, name in enumerate(search.profiles):
        if name not in bundled:
            raise InvalidSpec(f"{field}.profiles[{i}]", f"{name!r} is not a bundled profile",
                              f"Use one of: {', '.join(bundled)}")
    for key, values in search.grid:
        for i, value in enumerate(values):
            if key == "precision" and value not in PRECISIONS:
                raise InvalidSpec(f"{field}.grid.precision[{i}]",
                                  f"{value!r} is not a Code2Wav precision",
                                  f"Use one of: {', '.join(PRECISIONS)}")
    if search.num_candidates > search.max_candidates:
        raise InvalidSpec(
            f"{field}.maxCandidates",
            f"the spec's own profile plus {len(search.profiles)} profile(s) times "
            f"{len(search.combinations())} grid combination(s) make {search.num_candidates} "
            f"candidates, more than {search.max_candidates}",
            "Raise maxCandidates (at most 16), or list fewer profiles or grid values")
    if not search.enabled:
        return
    if slo is None:
        raise InvalidSpec("spec.slo", "is required when spec.profile.search.enabled is true",
                          "State the targets a candidate must meet, e.g. spec.slo."
                          "firstAudioP95Ms and spec.slo.minAudioSecondsPerSecond")
    if not perf_enabled or placement != "dedicated":
        raise InvalidSpec(
            "spec.perf.placement" if perf_enabled else "spec.perf.enabled",
            "a profile search benchmarks every candidate on a GPU of its own, but spec.perf "
            + (f"placement is {placement}" if perf_enabled else "is disabled"),
            "Set spec.perf.enabled true with placement dedicated, or turn the search off")
