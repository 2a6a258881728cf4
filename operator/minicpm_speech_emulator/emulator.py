"""An in-memory Kubernetes API server for tests and the ``demo`` command.

It is kmock's ``KubernetesEmulator`` plus the parts of the API server's contract that Kopf
and the operator depend on and that kmock 0.8 lacks: server-filled metadata, optimistic
concurrency (409/422), a status subresource kept apart from the object, the
``/api/v1/namespaces`` routes, watches that cannot miss an event, finalizers and garbage
collection through ``ownerReferences``, and Kubernetes' own rules for names (DNS-1123
subdomains, DNS-1035 labels for Services, DNS-1123 labels for Namespaces), labels (keys and
values) and size (a write body over 1.5 MiB, what etcd stores at most, is refused with 413),
answered as a real API server does (422 ``Invalid`` with its causes). Known gaps that
remain: strategic-merge patches are applied as JSON merge patches (lists are replaced whole),
set-based label selectors, paging, watch bookmarks and ``timeoutSeconds`` are not
supported, and no controllers run (Deployments never get Pods or a status unless a test
writes one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import datetime
import random
import re
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock import Response as _Response  # type: ignore[attr-defined]  # not in __all__
from minicpm_speech_contract.bounded import API_SERVER_MAX_JSON_DEPTH, json_depth

Body = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]

NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")

# kmock's URL parser reads ``/api/v1/namespaces[/NAME]`` as a namespace prefix with no
# resource (and fails outright on the bare list), so these paths are parsed here instead.
_NAMESPACE_PATH = re.compile(
    r"/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?"
)

_WRITES = ("POST", "PUT", "PATCH")

# Watches end when the emulator stops, so that the HTTP server does not wait for them.
_END_OF_STREAM = object()


class KubernetesStatusError(kmock.KubernetesError):
    """An API answer other than success; rendered by kmock as a ``Status`` object."""


@dataclasses.dataclass
class Fault:
    """What a misbehaving API server does to matching requests, injected by a test: answer
    ``status`` instead of serving, or serve after ``delay_s``. It applies to the next
    ``times`` matching requests, each with ``probability`` (drawn from the emulator's seeded
    generator, so a schedule repeats run to run)."""

    method: str  # an HTTP method, or "*"
    path: str  # a regular expression searched in the request's path
    status: int | None = None
    delay_s: float = 0.0
    times: int = 1
    probability: float = 1.0

    def matches(self, method: str, path: str) -> bool:
        return (self.times > 0 and self.method in ("*", method.upper())
                and re.search(self.path, path) is not None)


def _error(status: int, reason: str, message: str) -> KubernetesStatusError:
    return KubernetesStatusError(status=status, reason=reason, message=message, details={})


# Kubernetes' validation rules (k8s.io/apimachinery/pkg/util/validation), kept here and not
# imported from the operator: the emulator stands for the API server, which owns them.
MAX_OBJECT_BYTES = 1536 * 1024  # etcd's default request limit, the largest object it stores
MAX_ANNOTATIONS_BYTES = 256 * 1024  # all of an object's annotations, keys and values together
# (field, offending value, why): a value of None is a field that is too long as a whole.
Cause = tuple[str, str | None, str]
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = f"({_LABEL_NAME})?"
_SUBDOMAIN_RULE = (
    f"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    f"or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    f"regex used for validation is '{_DNS1123_SUBDOMAIN}')")
_NAME_RULES = {  # by resource plural: (regex, max length, what it is)
    "services": (_DNS1035_LABEL, 63, (
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
        "an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
        f"'abc-123', regex used for validation is '{_DNS1035_LABEL}')")),
    "namespaces": (_DNS1123_LABEL, 63, (
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
        "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
        f"regex used for validation is '{_DNS1123_LABEL}')")),
}


def _name_causes(resource: kmock.resource, name: str) -> list[tuple[str, str, str]]:
    """(field, value, why) for each rule ``name`` breaks for this kind of object."""
    pattern, limit, rule = _NAME_RULES.get(
        resource.plural or "", (_DNS1123_SUBDOMAIN, 253, _SUBDOMAIN_RULE))
    causes = []
    if len(name) > limit:
        causes.append(("metadata.name", name, f"must be no more than {limit} characters"))
    if re.fullmatch(pattern, name) is None:
        causes.append(("metadata.name", name, rule))
    return causes


def _label_causes(field: str, labels: Any) -> list[tuple[str, str, str]]:
    if not isinstance(labels, Mapping):
        return []
    causes = []
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if prefix and (len(prefix) > 253 or not re.fullmatch(_DNS1123_SUBDOMAIN, prefix)):
            causes.append((field, str(key), f"prefix part {_SUBDOMAIN_RULE}"))
        if len(name) > 63 or not re.fullmatch(_LABEL_NAME, name):
            causes.append((field, str(key), (
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character, at most 63 characters")))
        if not isinstance(value, str) or len(value) > 63 or not re.fullmatch(_LABEL_VALUE, value):
            causes.append((f"{field}", str(value), (
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character, at "
                f"most 63 characters (regex used for validation is '{_LABEL_VALUE}')")))
    return causes


def _annotations_causes(body: Mapping[str, Any]) -> list[Cause]:
    """The API server bounds an object's annotations, keys and values together."""
    meta = body.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    size = sum(len(str(key)) + len(str(value)) for key, value in annotations.items())
    if size <= MAX_ANNOTATIONS_BYTES:
        return []
    return [("metadata.annotations", None, f"must have at most {MAX_ANNOTATIONS_BYTES} bytes")]


def _labels_causes(body: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Label maps the API server checks: the object's, its pod template's and its selector's."""
    def part(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = parent.get(key)
        return value if isinstance(value, Mapping) else {}

    spec = part(body, "spec")
    template, selector = part(spec, "template"), part(spec, "selector")
    return [
        *_label_causes("metadata.labels", part(body, "metadata").get("labels")),
        *_label_causes("spec.template.metadata.labels", part(template, "metadata").get("labels")),
        *_label_causes("spec.selector.matchLabels", selector.get("matchLabels")),
        *(_label_causes("spec.selector", selector) if body.get("kind") == "Service" else []),
    ]


async def _too_large(raw_request: aiohttp.web.BaseRequest) -> bool:
    if (raw_request.content_length or 0) > MAX_OBJECT_BYTES:
        return True
    try:
        return len(await raw_request.read()) > MAX_OBJECT_BYTES  # read once; kept for later
    except aiohttp.web.HTTPRequestEntityTooLarge:
        return True


def _too_deep(text: str) -> bool:
    if text.count("{") + text.count("[") <= API_SERVER_MAX_JSON_DEPTH:
        return False  # the flat scan is slow in Python; most bodies cannot be that deep
    return json_depth(text, stop_above=API_SERVER_MAX_JSON_DEPTH) > API_SERVER_MAX_JSON_DEPTH


def _invalid(kind: str, name: str, causes: list[Cause]) -> KubernetesStatusError:
    """422 Invalid, worded and structured as the API server's StatusError."""
    def said(value: str | None, why: str) -> str:
        return f"Too long: {why}" if value is None else f'Invalid value: "{value}": {why}'

    rendered = [f"{field}: {said(value, why)}" for field, value, why in causes]
    listed = rendered[0] if len(rendered) == 1 else f"[{', '.join(rendered)}]"
    return KubernetesStatusError(
        status=422, reason="Invalid", message=f'{kind} "{name}" is invalid: {listed}',
        details={"name": name, "kind": kind, "causes": [
            {"reason": "FieldValueTooLong" if value is None else "FieldValueInvalid",
             "message": said(value, why), "field": field} for field, value, why in causes]})


@dataclasses.dataclass(frozen=True)
class ApiRequest:
    """One answered API request, in the terms an RBAC rule uses."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str  # "" for the core group
    resource: str  # the plural, e.g. "configmaps"
    subresource: str | None
    namespace: str | None
    name: str | None
    user_agent: str
    # What a write sent (a merge patch, a created object), so a test can tell which fields
    # a client wrote; None for reads and for a body that is not JSON.
    body: Any = dataclasses.field(default=None, compare=False, repr=False)
    dry_run: bool = dataclasses.field(default=False, compare=False)


def rbac_verb(request: kmock.Request) -> str:
    """The verb an RBAC rule must grant for this request."""
    method = str(request.method.value).upper()
    if method == "GET":
        watching = request.params.get("watch", "").lower() in ("true", "1")
        return "watch" if watching else ("get" if request.name else "list")
    if method == "DELETE":
        return "delete" if request.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def load_crd(path: Path) -> Body:
    """The CustomResourceDefinition document of a YAML file (which may hold other documents)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            return doc
    raise ValueError(f"{path} holds no CustomResourceDefinition")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``None`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _spec_part(body: Mapping[str, Any]) -> dict[str, Any]:
    # What a generation counts: everything but metadata and status (the spec, for a CR).
    return {key: value for key, value in body.items() if key not in ("metadata", "status")}


def _owner_uids(body: Mapping[str, Any]) -> set[str]:
    refs = body.get("metadata", {}).get("ownerReferences") or []
    return {ref["uid"] for ref in refs if ref.get("uid")}


def _label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-based label selectors (``a=b,c!=d,e,!f``); set-based ones are refused."""
    terms = [term.strip() for term in selector.split(",") if term.strip()]
    if any(re.search(r"\s(in|notin)\s", term) for term in terms):
        raise _error(400, "BadRequest", "set-based label selectors are not emulated")

    def matches(labels: Mapping[str, str]) -> bool:
        for term in terms:
            if "!=" in term:
                key, value = term.split("!=", 1)
                ok = labels.get(key.strip()) != value.strip()
            elif "=" in term:
                key, value = term.replace("==", "=").split("=", 1)
                ok = labels.get(key.strip()) == value.strip()
            elif term.startswith("!"):
                ok = term[1:].strip() not in labels
            else:
                ok = term in labels
            if not ok:
                return False
        return True

    return matches


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """A Kubernetes API emulator that behaves like an API server where Kopf can tell."""

    _resource_version: int = attrs.field(default=0, init=False)
    _serving: kmock.Reaction = attrs.field(init=False)
    _own_payload_count: int = attrs.field(default=0, init=False)
    # Every watch event ever emitted, per resource: a watch that resumes from a resourceVersion
    # gets what happened after it, as from etcd's history (never compacted here).
    _history: dict[kmock.resource, list[Body]] = attrs.field(
        factory=lambda: collections.defaultdict(list), init=False
    )

    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _fault_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _fault_random: random.Random = attrs.field(factory=lambda: random.Random(0), init=False)
    faults_applied: list[tuple[str, str, int | None, float]] = attrs.field(
        factory=list, init=False
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # It decodes, copies and encodes what an API server accepts: JSON up to 10,000 levels.
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * API_SERVER_MAX_JSON_DEPTH))
        # The built-in resources (from kmock's bundled discovery data) and Kopf's peerings.
        with warnings.catch_warnings():  # kmock reads the file with a deprecated importlib call
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()
        for plural, namespaced in (("kopfpeerings", True), ("clusterkopfpeerings", False)):
            kind = "KopfPeering" if namespaced else "ClusterKopfPeering"
            self.resources[kmock.resource("kopf.dev", "v1", plural)] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=ALL_VERBS
            )
        # One reaction serves every resource request, ahead of the base class's own (which it
        # replaces) but behind any reaction a test adds with kmock's DSL.
        serving = (self.fallback**1)[_is_resource_request] << self._serve
        assert isinstance(serving, kmock.Reaction)
        self._serving = serving
        self._own_payload_count = len(self._payloads)

    # --- public API ---------------------------------------------------------------------

    def request_log(self) -> list[ApiRequest]:
        """Every resource request answered so far (discovery URLs such as /apis excluded)."""
        return [
            ApiRequest(
                verb=rbac_verb(request),
                group=request.resource.group or "",
                resource=request.resource.plural or "",
                subresource=request.subresource,
                namespace=request.namespace,
                name=request.name,
                user_agent=request.headers.get("User-Agent", ""),
                body=request.data if str(request.method.value).upper() in _WRITES else None,
                dry_run="dryRun" in request.params,
            )
            for request in list(self._requests)
            if _is_resource_request(request) and request.resource is not None
        ]

    async def create(self, resource: kmock.resource, body: Mapping[str, Any]) -> Body:
        """Create an object as if POSTed (metadata filled in, watchers notified)."""
        namespace = body.get("metadata", {}).get("namespace")
        async with self._lock:
            return await self._create(resource, namespace, copy.deepcopy(dict(body)))

    async def add_namespace(self, name: str) -> Body:
        return await self.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )

    async def apply_crd(self, crd: Path | Mapping[str, Any]) -> Body:
        """Serve a custom resource and store its CRD object, so that Kopf's CRD scan sees it."""
        body = load_crd(crd) if isinstance(crd, Path) else dict(crd)
        existing = self._live((CRDS, None, body["metadata"]["name"]))
        return existing if existing is not None else await self.create(CRDS, body)

    def inject(self, *faults: Fault, seed: int | None = None) -> None:
        """Add faults (safe from another thread); ``seed`` restarts their random draws."""
        with self._fault_lock:
            if seed is not None:
                self._fault_random.seed(seed)
            self._faults.extend(faults)

    def clear_faults(self) -> None:
        with self._fault_lock:
            self._faults.clear()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._fault_lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    if self._fault_random.random() >= fault.probability:
                        return None
                    fault.times -= 1
                    self.faults_applied.append((method, path, fault.status, fault.delay_s))
                    return fault
        return None

    async def end_watches(self) -> None:
        """Close every open watch stream (done before the server stops)."""
        for bus in list(self._buses.values()):
            await bus.put(_END_OF_STREAM)

    # --- request routing ----------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # aiohttp's own limit (1 MiB, answered in plain text) gives way to the API server's.
        raw_request = raw_request.clone(client_max_size=MAX_OBJECT_BYTES + 1)
        if raw_request.method in _WRITES and await _too_large(raw_request):
            return aiohttp.web.json_response(status=413, data={
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": 413, "reason": "RequestEntityTooLarge",
                "message": f"Request entity too large: limit is {MAX_OBJECT_BYTES}"})
        if raw_request.method in _WRITES and _too_deep(
                (await raw_request.read()).decode(errors="replace")):
            return aiohttp.web.json_response(status=400, data={
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": 400, "reason": "BadRequest",
                "message": f"the JSON nests deeper than {API_SERVER_MAX_JSON_DEPTH} levels"})
        fault = self._fault_for(raw_request.method, raw_request.path) if self._faults else None
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.status is not None:
                return aiohttp.web.json_response(status=fault.status, data={
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "code": fault.status, "reason": "InjectedFault",
                    "message": f"injected {fault.status} for {raw_request.method} "
                               f"{raw_request.path}"})
        match = _NAMESPACE_PATH.fullmatch(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        body = await raw_request.read()
        try:
            data = await raw_request.json() if body else None
        except ValueError:
            data = None
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode(errors="replace"),
            data=data,
            resource=NAMESPACES,
            name=match["name"],
            subresource=match["sub"],
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as exc:
            if self._errors:  # kept for kmock's strict mode, as its own __call__ does
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock matches a request against reactions by scanning the whole request history, so
        # a request costs more the longer the emulator runs. Unless a test added reactions of its
        # own, go straight to the one that serves resources.
        if len(self._payloads) == self._own_payload_count and _is_resource_request(request):
            return await self._serving(request)
        return await super(kmock.KubernetesEmulator, self)._handle(request)

    async def _serve(self, request: kmock.Request) -> Any:
        # kmock keeps a status set by a returned Response on the (shared) reaction, so every
        # answer sets its own; otherwise one 201 would stick to all later answers.
        verb = rbac_verb(request)
        return _Response(
            status=201 if verb == "create" else 200, payload=await self._answer(request, verb)
        )

    async def _answer(self, request: kmock.Request, verb: str) -> Any:
        resource = request.resource
        assert resource is not None  # guaranteed by _is_resource_request
        if resource not in self.resources:
            raise kmock.KubernetesResourceNotFoundError()
        if verb == "list":
            return self._list(request)
        if verb == "watch":
            return self._watch(request)
        if verb == "get":
            found = self._live(self._key(request))
            if found is None:
                raise _error(404, "NotFound", f"{resource.plural} {request.name!r} not found")
            return found
        dry_run = _dry_run(request, verb)
        async with self._lock:
            if verb == "create":
                # a copy: the request log keeps what the client sent
                body = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
                namespace = request.namespace or body.get("metadata", {}).get("namespace")
                return await self._create(resource, namespace, body, dry_run=dry_run)
            if verb in ("patch", "update"):
                return await self._update(request, replace=verb == "update", dry_run=dry_run)
            if verb == "delete":
                if dry_run:
                    return await self._answer(request, "get")
                return await self._delete(self._key(request), orphan=_orphans(request))
            if verb == "deletecollection":
                keys = [key for key, _ in self._matching(request)]
                items = [await self._delete(key, orphan=_orphans(request)) for key in keys]
                return {"apiVersion": "v1", "kind": "List", "items": items}
        raise _error(405, "MethodNotAllowed", f"{verb} is not supported")

    # --- reading ------------------------------------------------------------------------

    def _key(self, request: kmock.Request) -> ObjectKey:
        assert request.resource is not None and request.name is not None
        return (request.resource, request.namespace, request.name)

    def _live(self, key: ObjectKey) -> Body | None:
        if key not in self._objects:  # kmock's ObjectsArray has no .get()
            return None
        obj = self._objects[key]
        return None if obj.deleted else obj.raw

    def _matching(self, request: kmock.Request) -> list[tuple[ObjectKey, Body]]:
        selects = _selector(request)
        return [(key, body) for key, body in self._live_objects() if selects(key, body)]

    def _list(self, request: kmock.Request) -> Body:
        resource = request.resource
        assert resource is not None
        return {
            "apiVersion": f"{resource.group}/{resource.version}".lstrip("/"),
            "kind": f"{self.resources[resource].kind or 'Object'}List",
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": [body for _, body in self._matching(request)],
        }

    async def _watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""  # lets kmock send the headers before the first event
        resource = request.resource
        assert resource is not None
        bus, selects = self._buses[resource], _selector(request)
        # Subscribe before reading the past, both under the lock that every change holds: then
        # no change can fall between the two and be missed. Without a resourceVersion the past is
        # a snapshot of ADDED events; with one, it is what happened after that version (a watch
        # that replayed older states would make Kopf act on stale objects).
        since = request.params.get("resourceVersion", "")
        async with self._lock:
            mark = await bus.mark()
            if since.isdigit() and since != "0":
                past = [e for e in self._history[resource] if _version(e) > int(since)]
            else:
                past = [{"type": "ADDED", "object": body} for _, body in self._matching(request)]
        try:
            for event in past:
                if _selects_event(selects, resource, event):
                    yield event
            async for event in bus.stream(since=mark):
                if event is _END_OF_STREAM:
                    return
                if _selects_event(selects, resource, event):
                    yield event
        finally:
            await bus.unmark(mark)

    # --- writing (all under self._lock) -------------------------------------------------

    def _next_version(self) -> str:
        # One counter for the whole cluster, as etcd's revision is.
        self._resource_version += 1
        return str(self._resource_version)

    def _has_status(self, resource: kmock.resource) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    async def _emit(self, resource: kmock.resource, kind: str, body: Body) -> None:
        event = {"type": kind, "object": body}
        self._history[resource].append(event)
        await self._buses[resource].put(event)

    async def _create(self, resource: kmock.resource, namespace: str | None, body: Body,
                      dry_run: bool = False) -> Body:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if not meta.get("name"):
            raise _error(422, "Invalid", "metadata.name or metadata.generateName is required")
        namespaced = (
            self.resources[resource].namespaced
            if resource in self.resources
            else namespace is not None
        )
        if namespaced and not namespace:
            raise _error(422, "Invalid", "a namespaced object needs a namespace")
        causes: list[Cause] = [*_name_causes(resource, meta["name"]), *_labels_causes(body),
                               *_annotations_causes(body)]
        if causes:
            raise _invalid(self._kind(resource, body), meta["name"], causes)
        key: ObjectKey = (resource, namespace if namespaced else None, meta["name"])
        if self._live(key) is not None:
            raise _error(409, "AlreadyExists", f"{resource.plural} {meta['name']!r} already exists")
        if namespaced:
            meta["namespace"] = namespace
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_version(),
            generation=1,
            creationTimestamp=_now(),
        )
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(transient, None)
        if self._has_status(resource):
            body.pop("status", None)  # the server ignores status on create, as on the main object
        body.update(_initial_status(resource, body))
        if dry_run:
            return body  # validated and answered as stored, but not stored
        if resource == CRDS:
            self._serve_crd(body)
        if key in self._objects:
            self._objects[key].create(body)
        else:
            self._objects[key] = body
        await self._emit(resource, "ADDED", body)
        # A dependent whose owners are all gone is collected at once, as the garbage collector
        # would do a moment later.
        owners = _owner_uids(body)
        if owners and not any(self._find_uid(uid) for uid in owners):
            await self._delete(key, orphan=False)
        return body

    async def _update(self, request: kmock.Request, *, replace: bool, dry_run: bool = False
                      ) -> Body:
        key = self._key(request)
        found = self._live(key)
        if found is None:
            raise _error(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
        old = copy.deepcopy(found)  # stored versions share nested dicts and must stay unchanged
        data = request.data
        if isinstance(data, list):
            try:  # applied to a copy: a failed "test" op changes nothing and answers 422
                patched = jsonpatch.apply_patch(old, data)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise _error(422, "Invalid", f"the JSON patch was not applied: {exc}") from exc
        elif isinstance(data, dict):
            expected = data.get("metadata", {}).get("resourceVersion")
            if expected is not None and str(expected) != old["metadata"]["resourceVersion"]:
                raise _error(
                    409,
                    "Conflict",
                    "the object has been modified; apply your changes to the latest version",
                )
            patched = copy.deepcopy(data) if replace else _merge_patch(old, data)
        else:
            raise _error(
                415, "UnsupportedMediaType", "the body must be a JSON object or a JSON patch"
            )

        # The status subresource and the main object are written separately.
        if request.subresource == "status":
            new = dict(copy.deepcopy(old), status=patched.get("status"))
        else:
            new = dict(
                copy.deepcopy(patched), metadata=copy.deepcopy(patched.get("metadata") or {})
            )
            if self._has_status(key[0]):
                new["status"] = copy.deepcopy(old.get("status"))
        if new.get("status") is None:
            new.pop("status", None)

        # Identity and lifecycle fields belong to the server.
        meta = new["metadata"]
        for field in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
        ):
            meta.pop(field, None)
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        if new == old:
            return old  # a no-op write changes nothing, not even the resourceVersion
        causes: list[Cause] = [*_labels_causes(new), *_annotations_causes(new)]
        if causes:
            raise _invalid(self._kind(key[0], new), key[2], causes)
        if _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if dry_run:
            return new
        meta["resourceVersion"] = self._next_version()
        self._objects[key].history.append(new)
        await self._emit(key[0], "MODIFIED", new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(key)
        return new

    async def _delete(self, key: ObjectKey, *, orphan: bool) -> Body:
        body = self._live(key)
        if body is None:
            raise _error(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return body  # already being deleted: waiting for its finalizers
        if meta.get("finalizers"):
            body = copy.deepcopy(body)
            body["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
            body["metadata"]["resourceVersion"] = self._next_version()
            self._objects[key].history.append(body)
            await self._emit(key[0], "MODIFIED", body)
            return body
        return await self._remove(key, orphan=orphan)

    async def _remove(self, key: ObjectKey, *, orphan: bool = False) -> Body:
        body = copy.deepcopy(self._objects[key].raw)
        body["metadata"]["resourceVersion"] = self._next_version()
        self._objects[key].delete()
        await self._emit(key[0], "DELETED", body)
        # Background cascading deletion: the dependents, and everything in a deleted namespace
        # (a real namespace stays Terminating until emptied; here it goes at once).
        uid = body["metadata"].get("uid")
        emptied = key[2] if key[0] == NAMESPACES else None
        for other, other_body in self._live_objects():
            owned = not orphan and uid in _owner_uids(other_body)
            if (owned or (emptied and other[1] == emptied)) and self._live(other) is not None:
                await self._delete(other, orphan=False)
        return body

    def _kind(self, resource: kmock.resource, body: Mapping[str, Any]) -> str:
        known = self.resources[resource].kind if resource in self.resources else None
        return str(known or body.get("kind") or resource.plural)

    def _live_objects(self) -> list[tuple[ObjectKey, Body]]:
        return [(key, obj.raw) for key, obj in self._objects.items() if not obj.deleted]

    def _find_uid(self, uid: str) -> bool:
        return any(body.get("metadata", {}).get("uid") == uid for _, body in self._live_objects())

    def _serve_crd(self, crd: Mapping[str, Any]) -> None:
        spec, names = crd["spec"], crd["spec"]["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            self.resources[kmock.resource(spec["group"], version["name"], names["plural"])] = (
                kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    shortnames=names.get("shortNames") or (),
                    categories=names.get("categories") or (),
                    subresources=set(version.get("subresources") or {}),
                    verbs=ALL_VERBS,
                )
            )


def _selector(request: kmock.Request) -> Callable[[ObjectKey, Body], bool]:
    """Which objects a list or watch request asks for: by namespace, name and selectors."""
    labels = _label_matcher(request.params.get("labelSelector", ""))
    field_terms = request.params.get("fieldSelector", "").replace("==", "=").split(",")
    fields = dict(term.split("=", 1) for term in field_terms if "=" in term)

    def selects(key: ObjectKey, body: Body) -> bool:
        resource, namespace, name = key
        return (
            resource == request.resource
            and request.namespace in (None, namespace)
            and request.name in (None, name)
            and fields.get("metadata.name", name) == name
            and fields.get("metadata.namespace", namespace) == namespace
            and labels(body.get("metadata", {}).get("labels") or {})
        )

    return selects


def _selects_event(
    selects: Callable[[ObjectKey, Body], bool], resource: kmock.resource, event: Body
) -> bool:
    meta = event["object"]["metadata"]
    return selects((resource, meta.get("namespace"), meta["name"]), event["object"])


def _version(event: Body) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


def _is_resource_request(request: kmock.Request) -> bool:
    # Discovery URLs (/api, /apis/GROUP/VERSION, ...) parse to a resource without a plural.
    return request.resource is not None and bool(request.resource.plural)


def _dry_run(request: kmock.Request, verb: str) -> bool:
    """``?dryRun=All``: validated, admitted and answered, never stored. The API server accepts
    no other value."""
    value = request.params.get("dryRun")
    if value is not None and (value != "All" or verb not in ("create", "patch", "update",
                                                              "delete")):
        raise _error(400, "BadRequest", f"dryRun must be All for {verb}, not {value[:64]!r}")
    return value is not None


def _orphans(request: kmock.Request) -> bool:
    options = request.data if isinstance(request.data, dict) else {}
    policy = request.params.get("propagationPolicy") or options.get("propagationPolicy")
    return policy == "Orphan" or options.get("orphanDependents") is True


def _initial_status(resource: kmock.resource, body: Mapping[str, Any]) -> Body:
    # What the API server itself writes into status on create, for the kinds where Kopf or a
    # test would look at it.
    if resource == NAMESPACES:
        return {"status": {"phase": "Active"}}
    if resource == CRDS:
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": _now()}
            for kind in ("NamesAccepted", "Established")
        ]
        return {"status": {"conditions": conditions, "acceptedNames": body["spec"]["names"]}}
    return {}


@dataclasses.dataclass(frozen=True)
class RunningEmulator:
    """A served emulator: where it listens and a kubeconfig file that points there."""

    emulator: ClusterEmulator
    url: str
    kubeconfig_path: Path


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def running_emulator(
    crd_path: Path,
    namespaces: Sequence[str] = ("default",),
    *,
    kubeconfig_path: Path | None = None,
) -> AsyncIterator[RunningEmulator]:
    """Serve a fresh emulator on 127.0.0.1 (a free port) with the CRD and namespaces in place."""
    emulator = ClusterEmulator()
    async with emulator, kmock.Server(emulator) as server:
        for namespace in namespaces:
            await emulator.add_namespace(namespace)
        await emulator.apply_crd(crd_path)
        url = str(server.url).rstrip("/")
        with tempfile.TemporaryDirectory(prefix="emulator-") as tmp:
            path = write_kubeconfig(
                kubeconfig_path or Path(tmp) / "kubeconfig",
                url,
                namespaces[0] if namespaces else "default",
            )
            try:
                yield RunningEmulator(emulator=emulator, url=url, kubeconfig_path=path)
            finally:
                await emulator.end_watches()


class BackgroundEmulator:
    """Serves an emulator from its own thread and event loop.

    The caller's own loop may then block (the official client is synchronous, Kopf's test
    runner joins threads), and Kopf, which at its stop waits for every task of its loop,
    never waits for the server's connections.
    """

    def __init__(self, crd_path: Path, namespaces: tuple[str, ...], kubeconfig_path: Path) -> None:
        self._args = (crd_path, namespaces, kubeconfig_path)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.running: RunningEmulator | None = None

    def __enter__(self) -> RunningEmulator:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise TimeoutError("the emulator did not start within 30s")
        if self._error is not None or self.running is None:
            raise RuntimeError("the emulator failed to start") from self._error
        return self.running

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise RuntimeError("the emulator did not stop within 30s")

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        crd_path, namespaces, kubeconfig_path = self._args
        try:
            async with running_emulator(
                crd_path, namespaces, kubeconfig_path=kubeconfig_path
            ) as running:
                self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
                self.running = running
                self._ready.set()
                await self._stopping.wait()
        except BaseException as error:
            self._error = error
            raise
        finally:
            self._ready.set()
