"""Small aiohttp servers on loopback for collector tests, and one delivery through a collector."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def serve(routes, **app_options: Any) -> tuple[web.AppRunner, int]:  # noqa: ANN001 - (method, path, handler)
    """Start a server on 127.0.0.1 with ``routes`` (``app_options`` for its Application, e.g.
    ``client_max_size``); its runner (``cleanup()`` stops it) and port."""
    app = web.Application(**app_options)
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def deliver_once(collector: Any, body: bytes) -> Any:
    """Start ``collector``, deliver ``body``, close it: what ``deliver`` gave."""
    await collector.start()
    try:
        return await collector.deliver(body)
    finally:
        await collector.close()
