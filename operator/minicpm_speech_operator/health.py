"""The operator's /healthz, served from process start.

A standby replica waiting for the Lease has no Kopf running yet, and must still pass
its liveness probe, or the kubelet would restart it forever.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web


@dataclass(slots=True)
class Health:
    operator: asyncio.Task[None] | None = None

    @property
    def role(self) -> str:
        return "standby" if self.operator is None else "leader"

    def is_alive(self) -> bool:
        return self.operator is None or not self.operator.done()


async def serve_health(port: int, health: Health, address: str = "0.0.0.0") -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        if health.is_alive():
            return web.json_response({"status": "ok", "role": health.role})
        return web.json_response({"status": "operator stopped"}, status=503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    return runner
