"""The server's client of its gateways keeps each node's connections alive, however many nodes there are."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from polar_cli.node_protocol import GatewayClient, NodeCapacity, RegisterBody
from polar_cli.server.config import ServerConfig
from polar_cli.server.service import RolloutServer
from polar_cli.web.errors import json_response

NODES = 30
"""More than an HTTP client's 20 kept-alive connections: one pool shared by every node closed some after each round."""


@dataclass(frozen=True)
class Node:
    url: str
    token: str = "tok"


async def _gateways(peers: list[set[tuple[str, int]]]) -> tuple[list[web.AppRunner], list[Node]]:
    runners, nodes = [], []
    for seen in peers:

        async def inference(request: web.Request, seen: set[tuple[str, int]] = seen) -> web.Response:
            seen.add(request.transport.get_extra_info("peername") if request.transport else ("?", 0))
            return json_response({"error": {"message": "no pool here", "type": "not_found"}}, 404)

        app = web.Application()
        app.router.add_get("/inference", inference)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        nodes.append(Node(url=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    return runners, nodes


def test_each_node_keeps_its_connection_across_rounds_of_calls_to_every_node() -> None:
    peers: list[set[tuple[str, int]]] = [set() for _ in range(NODES)]

    async def rounds() -> None:
        runners, nodes = await _gateways(peers)
        try:
            async with GatewayClient(timeout=10) as gateways:
                for _ in range(4):  # every node at once, then again: the second round finds each connection open
                    replies = await asyncio.gather(*(gateways.inference(node) for node in nodes))
                    assert {reply.status for reply in replies} == {404}
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(rounds())
    assert [len(seen) for seen in peers] == [1] * NODES  # one connection per node, reused, never reopened


def test_a_forgotten_node_url_gets_a_new_connection() -> None:
    """A node that registers again at another URL: the server closes the pool of the old one (none is kept per URL a
    node ever had)."""
    peers: list[set[tuple[str, int]]] = [set()]

    async def calls() -> None:
        runners, [node] = await _gateways(peers)
        try:
            async with GatewayClient(timeout=10) as gateways:
                await gateways.inference(node)
                await gateways.inference(node)
                await gateways.forget(node.url)
                await gateways.forget(node.url)  # not known any more: nothing to close
                await gateways.inference(node)
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(calls())
    assert len(peers[0]) == 2


def test_a_node_registering_at_another_url_has_the_old_urls_pool_closed(tmp_path: Path) -> None:
    peers: list[set[tuple[str, int]]] = [set(), set()]

    async def move() -> None:
        runners, [first, second] = await _gateways(peers)
        try:
            async with RolloutServer(ServerConfig(data_dir=tmp_path, token="t" * 32)) as server:
                capacity = NodeCapacity(run_slots=1)
                await server.register(RegisterBody(url=first.url, token="tok", node_id="n1", capacity=capacity))
                await server.gateways.inference(first)
                await server.register(RegisterBody(url=second.url, token="tok", node_id="n1", capacity=capacity))
                await server.gateways.inference(first)  # the old URL, asked again: a new connection
                assert len(peers[0]) == 2
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(move())
