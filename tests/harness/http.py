"""Raw HTTP access to an emulator served in the test's own event loop (for emulator tests)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from minicpm_speech_emulator import ClusterEmulator, RunningEmulator, running_emulator

CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


@dataclasses.dataclass
class EmulatorHttp:
    running: RunningEmulator
    session: aiohttp.ClientSession

    @property
    def emulator(self) -> ClusterEmulator:
        return self.running.emulator

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        patch: str = "merge",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON) of one request; PATCH bodies are sent as ``patch`` type."""
        headers = {
            "Content-Type": CONTENT_TYPES[patch] if method == "PATCH" else "application/json"
        }
        data = None if body is None else json.dumps(body)
        async with self.session.request(
            method, path, data=data, headers=headers, params=params
        ) as rsp:
            return rsp.status, await rsp.json(content_type=None)

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Any, *, patch: str = "merge") -> tuple[int, Any]:
        return await self.request("PATCH", path, body, patch=patch)

    async def delete(self, path: str, body: Any = None) -> tuple[int, Any]:
        return await self.request("DELETE", path, body)

    @contextlib.asynccontextmanager
    async def watch(self, path: str, **params: str) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a watch stream; iterate it for events (decoded JSON lines)."""
        async with self.session.get(path, params={"watch": "true", **params}) as rsp:
            assert rsp.status == 200, await rsp.text()

            async def events() -> AsyncIterator[dict[str, Any]]:
                async for line in rsp.content:
                    if line.strip():
                        yield json.loads(line)

            yield events()


@contextlib.asynccontextmanager
async def emulator_http(crd_path: Path, namespaces: tuple[str, ...]) -> AsyncIterator[EmulatorHttp]:
    async with (
        running_emulator(crd_path, namespaces) as running,
        aiohttp.ClientSession(base_url=running.url) as session,
    ):
        yield EmulatorHttp(running, session)
