"""A localhost asyncio server on a free port: the lifecycle shared by the tests' fake HTTP peers."""

from __future__ import annotations

import asyncio
from typing import Any


class LocalServer:
    """`async with Sub() as s:` serves `s.handle` at `s.url` until the block ends."""

    async def __aenter__(self) -> Any:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
