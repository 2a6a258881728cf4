"""The cluster a test runs against: a fresh emulator, or a real cluster named by KUBECONFIG."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException
from minicpm_speech_emulator import (
    ApiRequest,
    BackgroundEmulator,
    ClusterEmulator,
    load_crd,
)

from .api import USER_AGENT, KubeApi
from .crds import CustomResource

T = TypeVar("T")


async def wait_for(
    predicate: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = 20.0,
    *,
    interval: float = 0.1,
    message: str = "",
) -> T:
    """Poll until the predicate returns something truthy, and return that.

    A blocking predicate (e.g. one that calls ``cluster.api``) runs in a worker thread, so the
    test's event loop stays free; an ``async def`` predicate, or one returning an awaitable,
    is awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        if inspect.iscoroutinefunction(predicate):
            result = await predicate()
        else:
            result = await asyncio.to_thread(predicate)
            if inspect.isawaitable(result):
                result = await result
        if result:
            return cast(T, result)
        if time.monotonic() > deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"not true within {timeout:g}s: {what} (last: {result!r})")
        await asyncio.sleep(interval)


@dataclasses.dataclass
class Cluster:
    """What a test gets from the ``cluster`` fixture."""

    kubeconfig_path: Path
    namespace: str  # fresh for every test
    api: KubeApi  # the harness's own client, bound to ``namespace``
    emulator: ClusterEmulator | None  # None on a real cluster

    @property
    def is_emulated(self) -> bool:
        return self.emulator is not None

    def request_log(self, *, include_harness: bool = False) -> list[ApiRequest]:
        """API requests the emulator answered, without the harness's own unless asked.

        On a real cluster nothing is recorded and the log is empty.
        """
        if self.emulator is None:
            return []
        log = self.emulator.request_log()
        return log if include_harness else [r for r in log if r.user_agent != USER_AGENT]

    async def wait_for(
        self,
        predicate: Callable[[], T | Awaitable[T | None] | None],
        timeout: float = 20.0,
        *,
        interval: float = 0.1,
        message: str = "",
    ) -> T:
        return await wait_for(predicate, timeout, interval=interval, message=message)


def unique_namespace(test_name: str) -> str:
    """A DNS-1123 label unique per test, readable in ``kubectl get ns``."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def emulated_cluster(crd_path: Path, namespace: str, workdir: Path) -> Iterator[Cluster]:
    kubeconfig_path = workdir / "kubeconfig"
    with BackgroundEmulator(crd_path, ("default", namespace), kubeconfig_path) as running:
        api = KubeApi(running.kubeconfig_path, namespace, CustomResource.from_crd(crd_path))
        try:
            yield Cluster(running.kubeconfig_path, namespace, api, running.emulator)
        finally:
            api.close()


_applied_crds: set[tuple[str, Path]] = set()  # (kubeconfig, CRD file): applied once per test run


@contextlib.contextmanager
def real_cluster(kubeconfig: str, crd_path: Path, namespace: str) -> Iterator[Cluster]:
    """A unique namespace on the cluster KUBECONFIG names, with the CRD applied there."""
    client = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, persist_config=False
    )
    client.user_agent = USER_AGENT
    try:
        if (kubeconfig, crd_path) not in _applied_crds:
            _apply_crd(kubernetes.client.ApiextensionsV1Api(client), load_crd(crd_path))
            _applied_crds.add((kubeconfig, crd_path))
        core = kubernetes.client.CoreV1Api(client)
        labels = {"app.kubernetes.io/created-by": "minicpm-speech-tests"}
        core.create_namespace({"metadata": {"name": namespace, "labels": labels}})  # type: ignore[arg-type]
        api = KubeApi(kubeconfig, namespace, CustomResource.from_crd(crd_path))
        try:
            yield Cluster(Path(kubeconfig), namespace, api, None)
        finally:
            # The operator is stopped by now: release its finalizers, or the namespace would
            # stay Terminating for ever.
            for speech in api.list_objects("minicpmspeech"):
                if speech["metadata"].get("finalizers"):
                    api.patch(
                        "minicpmspeech",
                        speech["metadata"]["name"],
                        {"metadata": {"finalizers": None}},
                    )
            api.close()
            core.delete_namespace(namespace)
    finally:
        client.close()


def _apply_crd(api: kubernetes.client.ApiextensionsV1Api, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    try:
        api.create_custom_resource_definition(crd)  # type: ignore[arg-type]
    except ApiException as error:
        if error.status != 409:
            raise
        current = json_of(api.read_custom_resource_definition(name, _preload_content=False))
        crd = {
            **crd,
            "metadata": {
                **crd["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        api.replace_custom_resource_definition(name, crd)  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conditions = json_of(api.read_custom_resource_definition(name, _preload_content=False))
        established = [
            c
            for c in (conditions.get("status") or {}).get("conditions") or []
            if c["type"] == "Established"
        ]
        if established and established[0]["status"] == "True":
            return
        time.sleep(0.5)
    raise TimeoutError(f"CRD {name} not established within 60s")


def json_of(response: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(response.data)
    return result
