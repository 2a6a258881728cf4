"""What Kopf remembers of the last spec it handled: a digest, not the spec itself.

Kopf tells a create from an update, and an update from an unrelated event, by comparing the
object's essence (spec, labels, annotations) with the one it stored after the last success,
by default whole in an annotation. An object's annotations are bounded at 256 KiB by the API
server, so any spec larger than that made the store fail with 422 after every successful
handler, and Kopf ran the handler again, without end. Every handler here reconciles the whole
resource and reads neither ``old`` nor ``diff``, so a digest of the essence detects the same
changes in 80 bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, cast

import kopf

from .manifests import GROUP

DIFFBASE_KEY = "last-handled-configuration"


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    def __init__(self) -> None:
        super().__init__(prefix=GROUP, key=DIFFBASE_KEY)

    def build(self, *, body: kopf.Body,
              extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = cast(dict[str, Any], super().build(body=body, extra_fields=extra_fields))
        annotations = essence.get("metadata", {}).get("annotations", {})
        for key in [key for key in annotations if key.startswith(f"{GROUP}/")]:
            del annotations[key]  # the operator's own bookkeeping is not the user's change
        return cast(kopf.BodyEssence, {"sha256": essence_digest(essence)})


def essence_digest(essence: Any) -> str:
    canonical = json.dumps(essence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
