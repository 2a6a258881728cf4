"""Concurrency profiles: load, validate, merge with overrides, render the deploy config.

A profile (``profiles/*.yaml``, or one a user keeps in a ConfigMap) is a vLLM-Omni
deploy-config overlay: a few per-stage limits, per-stage CUDA KV-cache sizes and the
Code2Wav options carried in the shared-memory connector's ``extra`` mapping. A user's
``profileOverrides`` have the same shape and are deep-merged into it. ``profiles/schema.json``
describes both; an unknown key, a wrong type or a value out of range is refused with the
full path a user would write (``spec.profileOverrides.stages[stage_id=2].max_num_seqs``)
and a one-sentence fix.

The rendered deploy config is an overlay, not a complete file: its first key,
``base_config``, is the absolute path of vLLM-Omni's ``minicpmo_4_5_turn.yaml`` inside the
serving image, given by the caller. vLLM-Omni resolves that path and merges the overlay
onto it (stages by ``stage_id``, connectors and platforms deep-merged, top-level scalars
overlay-wins). An overlay because:

- the operator cannot see vLLM-Omni's files, which live only inside the serving image;
- the overlay stays small and reviewable: it holds exactly what a profile changes;
- upstream fixes to the base flow in with the pinned image, with nothing copied here;
- the image, hence the base, is part of the config hash computed elsewhere, so a new
  image rolls the pods just as a new overlay does.

Merging follows vLLM-Omni's overlay semantics: mappings merge recursively, ``stages`` and
``platforms.<platform>.stages`` merge item by item on ``stage_id``, any other list is
replaced whole. (Inside a stage, vLLM-Omni itself replaces a mapping such as
``limit_mm_per_prompt`` whole when it applies the overlay to its base; merging it here
keeps a partial override from dropping the profile's other entries.)

Beyond the schema, rendering refuses combinations that would only fail once the server
starts or is under load: a Talker KV cache too small for its streams (the Talker cannot
be preempted), setup graphs larger than the Code2Wav micro-batch, a scheduler token
budget below ``max_num_seqs``, an initial Code2Wav batch below its minimum. These rules
need a complete profile, so :func:`validate_profile` (which also takes partial overrides)
leaves them to :func:`render_deploy_config`.

Rendering is deterministic: keys sorted (``base_config`` first), stages sorted by
``stage_id``, fixed formatting; the same input gives the same bytes and the same hash,
whatever the order of the input mappings.

The package's modules, one job each: :mod:`.loading` reads the bundled profiles and parses
YAML, :mod:`.validation` checks a document against the schema and explains the first
problem with its path, :mod:`.merging` deep-merges overrides, :mod:`.rules` holds the rules
across keys and :mod:`.rendering` renders and hashes the overlay.
"""

from __future__ import annotations

from .loading import bundled_profile_names, load_bundled_profile, parse_profile_text
from .merging import merge_overrides
from .rendering import RenderedDeployConfig, render_deploy_config
from .validation import ProfileError, validate_profile

__all__ = [
    "ProfileError",
    "RenderedDeployConfig",
    "bundled_profile_names",
    "load_bundled_profile",
    "merge_overrides",
    "parse_profile_text",
    "render_deploy_config",
    "validate_profile",
]
