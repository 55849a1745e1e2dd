"""A TCP relay: ``python -m tests.cluster.relay LISTEN_HOST TARGET_HOST PORT [PORT ...]``.

Listens on ``LISTEN_HOST:PORT`` for each port and copies bytes both ways to ``TARGET_HOST:PORT``. The test
cluster runs one in the root namespace so that its nodes reach PostgreSQL and Redis, which listen on
127.0.0.1 only, at the cluster's gateway address (tests/cluster/network.py). Prints ``relay ready`` once
every port listens; exits 2 with one ``error:`` line if a port cannot be bound.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(listen_host: str, target_host: str, ports: list[int]) -> None:
    async def handler(port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    servers = []
    for port in ports:
        try:
            servers.append(await asyncio.start_server(lambda r, w, p=port: handler(p, r, w), listen_host, port))
        except OSError as err:
            print(f"error: relay cannot listen on {listen_host}:{port}: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
    print("relay ready", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        sys.exit("usage: python -m tests.cluster.relay LISTEN_HOST TARGET_HOST PORT [PORT ...]")
    asyncio.run(_serve(argv[0], argv[1], [int(p) for p in argv[2:]]))


if __name__ == "__main__":
    main(sys.argv[1:])
