"""A service that goes away and comes back, for the outage tests: a TCP proxy in front of a real server (PostgreSQL,
Redis, the S3 server) that the test takes down (new connections refused, open ones cut, as when the server stops or
restarts), or makes hang (connections accepted, never answered, as behind a network partition), and brings up again
on the same port, without touching the server other tests share."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from urllib.parse import urlsplit, urlunsplit


def _free_port() -> int:
    """A port nothing listens on, from a range of its own (a proxy taken down must get its port back)."""
    for _ in range(200):
        port = random.randint(45000, 46999)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 45000 and 46999")


class Outage:
    """Listens on a port of its own and forwards every connection to `upstream` (host, port) while up."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = _free_port()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._silent = False

    def url(self, url: str) -> str:
        """`url` (a server's URL) pointed at this proxy instead."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    async def up(self) -> None:
        await self.down()
        self._silent = False
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def hang(self, cut: bool = True) -> None:
        """New connections are accepted and never answered; open ones are cut, or (`cut` False) left open and
        silent, as when a network partition drops their packets."""
        if cut:
            await self.down()
        elif self._server is not None:
            self._server.close()
        self._silent = True
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def down(self) -> None:
        """New connections are refused and every open one is cut."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        await asyncio.sleep(0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._silent:
            self._writers.add(writer)
            with contextlib.suppress(OSError):
                while await reader.read(65536):
                    pass
            self._writers.discard(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if not self._silent:
                        dst.write(data)
                        await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}


@contextlib.asynccontextmanager
async def outage_proxy(url: str, default_port: int):
    """An `Outage` in front of the server of `url`, up."""
    parts = urlsplit(url)
    proxy = Outage((parts.hostname or "127.0.0.1", parts.port or default_port))
    await proxy.up()
    try:
        yield proxy
    finally:
        await proxy.down()
