"""Converge one child object onto its desired state, idempotently.

Only the fields the operator sets are compared: the API server adds defaults, and other
controllers (or a user's `kubectl rollout restart`) add keys that are theirs to keep.
A field the operator sets and someone changed is restored.

Writing is split in three so that a set of children is written all or none: :func:`plan`
reads and decides each child's write (and finds a conflict before anything is written),
:func:`rehearse` sends every write as a server-side dry run, which meets the API server's
validation and its admission webhooks and policies, and only then :func:`carry_out` writes.

Some fields another controller owns once the object exists (the replicas of an autoscaled
Deployment): passed as ``create_only``, they are set on create and left out of every patch
and every comparison, so a reconcile never writes them back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from minicpm_speech_contract.paths import dig

from .errors import InvalidSpec
from .kubeapi import AlreadyExists, KubeApi

Action = Literal["created", "updated", "unchanged", "deleted"]
MapPath = tuple[str, ...]
# By kind: the paths written only when the object is created.
CreateOnly = dict[str, list[MapPath]]

# Maps the operator owns whole: a key it no longer sets is removed, not left behind.
OWNED_MAPS: dict[str, list[tuple[str, ...]]] = {
    "ConfigMap": [("data",)],
    # A switch to Recreate must drop rollingUpdate, which the API server refuses beside it.
    "Deployment": [("spec", "template", "spec", "nodeSelector"), ("spec", "strategy")],
}


class ChildConflict(InvalidSpec):
    reason = "ChildConflict"


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field of ``desired`` has the same value in ``live``."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            is_subset(value, live.get(key)) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(map(is_subset, desired, live)))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    # The API server answers quantities as strings ("1" for nvidia.com/gpu: 1).
    return desired == live or str(desired) == str(live)


def is_controlled_by(live: Mapping[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("uid") == owner_uid and ref.get("controller")
        for ref in live.get("metadata", {}).get("ownerReferences") or []
    )


def stale_keys(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[MapPath, list[str]]:
    """Keys of owned maps that live still has and desired no longer sets, by map path."""
    stale: dict[MapPath, list[str]] = {}
    for path in OWNED_MAPS.get(desired["kind"], []):
        wanted = dig(desired, path) or {}
        extra = [key for key in dig(live, path) or {} if key not in wanted]
        if extra:
            stale[path] = extra
    return stale


def merge_patch(desired: dict[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The desired object as a merge patch, with stale keys of owned maps set to null."""
    patch = {key: value for key, value in desired.items() if key not in ("apiVersion", "kind")}
    for path, keys in stale_keys(desired, live).items():
        _put(patch, path, {**(dig(desired, path) or {}), **dict.fromkeys(keys)})
    return patch


def _put(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value


@dataclass(frozen=True, slots=True)
class Write:
    """What converging one child takes: its create, its merge patch, or nothing."""

    desired: dict[str, Any]
    live: dict[str, Any] | None
    patch: dict[str, Any] | None  # None with a live object: unchanged

    @property
    def action(self) -> Action:
        if self.live is None:
            return "created"
        return "unchanged" if self.patch is None else "updated"


def without(obj: dict[str, Any], paths: list[MapPath]) -> dict[str, Any]:
    """A copy of ``obj`` without the fields at ``paths`` (the maps along them copied)."""
    if not paths:
        return obj
    copied = dict(obj)
    for path in paths:
        parent = copied
        for key in path[:-1]:
            if not isinstance(parent.get(key), Mapping):
                break
            parent[key] = dict(parent[key])
            parent = parent[key]
        else:
            parent.pop(path[-1], None)
    return copied


async def plan(api: KubeApi, desired: dict[str, Any], owner_uid: str,
               create_only: CreateOnly | None = None) -> Write:
    """Read the child and decide its write; a child someone else owns stops everything."""
    kind, meta = desired["kind"], desired["metadata"]
    live = await api.get(kind, meta["namespace"], meta["name"])
    if live is None:
        return Write(desired, None, None)
    if not is_controlled_by(live, owner_uid):
        raise ChildConflict(
            f"{kind} {meta['name']}",
            "exists and is not controlled by this MiniCPMSpeech",
            "Delete or rename that object, or give this MiniCPMSpeech another name",
        )
    desired = without(desired, (create_only or {}).get(kind, []))
    if is_subset(desired, live) and not stale_keys(desired, live):
        return Write(desired, live, None)
    return Write(desired, live, merge_patch(desired, live))


async def rehearse(api: KubeApi, write: Write) -> None:
    """The write as a dry run: a child the server would refuse raises here, stores nothing."""
    meta = write.desired["metadata"]
    if write.live is None:
        # created since plan(): carry_out() patches it instead
        with contextlib.suppress(AlreadyExists):
            await api.create(write.desired, dry_run=True)
    elif write.patch is not None:
        await api.patch(write.desired["kind"], meta["namespace"], meta["name"], write.patch,
                        dry_run=True)


async def carry_out(api: KubeApi, write: Write, owner_uid: str,
                    create_only: CreateOnly | None = None) -> tuple[Any, Action]:
    if write.live is None:
        try:
            return await api.create(write.desired), "created"
        except AlreadyExists:  # a racing writer created it: converge onto that one
            write = await plan(api, write.desired, owner_uid, create_only)
            if write.live is None:
                raise
    if write.patch is None:
        return write.live, "unchanged"
    meta = write.desired["metadata"]
    patched = await api.patch(write.desired["kind"], meta["namespace"], meta["name"],
                              write.patch)
    return patched, "updated"


async def apply(api: KubeApi, desired: dict[str, Any], owner_uid: str) -> tuple[Any, Action]:
    """One child, planned and written; a set of children goes through :func:`apply_all`."""
    return await carry_out(api, await plan(api, desired, owner_uid), owner_uid)


@dataclass(frozen=True, slots=True)
class Retired:
    """A child the resource no longer wants (an autoscaler turned off): deleted with the
    writes, and only when this resource controls it."""

    kind: str
    namespace: str
    name: str


async def apply_all(api: KubeApi, children: list[dict[str, Any]], owner_uid: str, *,
                    create_only: CreateOnly | None = None, retire: tuple[Retired, ...] = ()
                    ) -> tuple[list[tuple[Any, Action]], list[Retired]]:
    """Every child written, or none: each write is rehearsed before the first is made.

    Retired children go first, once every write has passed its rehearsal: an autoscaler is
    gone before the Deployment's replicas are written again, so the two never both write
    them. Returns each child's object and action, and the retired children deleted."""
    writes = [await plan(api, child, owner_uid, create_only) for child in children]
    for write in writes:
        await rehearse(api, write)
    deleted = []
    for child in retire:
        live = await api.get(child.kind, child.namespace, child.name)
        if live is not None and is_controlled_by(live, owner_uid) and await api.delete(
                child.kind, child.namespace, child.name):
            deleted.append(child)
    return [await carry_out(api, write, owner_uid, create_only) for write in writes], deleted
