"""What the gateway stores and what it releases, with the official Python SDK in front of
`ledger_server.py`: a tool's own failure (`isError: true`) is its outcome, stored and replayed
to a reworded retry without running again; a JSON-RPC error from the upstream releases the key,
so the retry runs. Then the same gateway on Streamable HTTP with a `--config` of one upstream:
each HTTP session gets its own hub, the tool is named `ledger__create_incident`, keyed by that
name, and a reworded retry in a new session replays it.

    python outcomes.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import json
import os
import sys

import anyio
import httpx2
from ledger_gateway import ledger_lines, ledger_path, store_dir
from ledger_gateway import params as gateway_params
from mcp import Client, ClientSession, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from listening import start_listening

gateway, python = sys.argv[1:3]
server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ledger_server.py")


def meta(step):
    return {"io.idemdb/task": "task-outcomes", "io.idemdb/step": step}


async def stdio_outcomes():
    async with stdio_client(gateway_params()) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        # A tool's own failure is stored: the retry replays it and the tool does not run.
        first = await s.call_tool("reject", {"title": "refund 40"}, meta=meta(1))
        assert first.is_error and "rejected: refund 40" in first.content[0].text, first
        retry = await s.call_tool("reject", {"title": "refund forty"}, meta=meta(1))
        assert retry.is_error and retry.content[0].text == first.content[0].text, retry
        assert retry.meta["io.idemdb/replayed"] is True, retry.meta
        assert retry.meta["io.idemdb/argumentsChanged"] is True, retry.meta
        # A JSON-RPC error is the moment's, not the request's: the key is released.
        try:
            await s.call_tool("unavailable", {"title": "DB down"}, meta=meta(2))
            raise AssertionError("the upstream's error was not passed on")
        except MCPError as e:
            assert e.error.code == -32050, e.error
        ran = await s.call_tool("unavailable", {"title": "DB down", "fail": False}, meta=meta(2))
        assert not ran.is_error and not ran.meta.get("io.idemdb/replayed"), ran
        again = await s.call_tool("unavailable", {"title": "DB down", "fail": False},
                                  meta=meta(2))
        assert again.meta["io.idemdb/replayed"] is True, again
        assert again.content[0].text == ran.content[0].text, again


def start_http_gateway():
    config = os.path.join(store_dir, "one.json")
    with open(config, "w") as f:
        json.dump({"mcpServers": {"ledger": {"command": python, "args": [server, ledger_path]}}},
                  f)
    return start_listening(
        [gateway, "serve", "--listen", "127.0.0.1:0", "--config", config, "--store",
         os.path.join(store_dir, "http.idem")])


async def http_call(url, title):
    async with httpx2.AsyncClient(headers={"x-idemdb-tenant": "agent-1"},
                                  timeout=httpx2.Timeout(30.0, read=60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            assert "ledger__create_incident" in tools, tools
            return await c.call_tool("ledger__create_incident", {"title": title},
                                     meta=meta(3), read_timeout_seconds=30.0)


async def config_on_http():
    proc, url = start_http_gateway()
    try:
        first = await http_call(url, "cache cold")
        retry = await http_call(url, "the cache is cold")
    finally:
        proc.kill()
        proc.wait()
    assert not (first.meta or {}).get("io.idemdb/replayed"), first
    assert retry.meta["io.idemdb/replayed"] is True, retry
    assert retry.content[0].text == first.content[0].text, (first, retry)
    assert first.meta["io.idemdb/key"] == "tc1:task-outcomes:3:ledger__create_incident", first


async def main():
    await stdio_outcomes()
    await config_on_http()
    lines = ledger_lines()
    assert [line.split("\t")[0] for line in lines] == ["refund 40", "DB down", "cache cold"], lines
    print(f"outcomes: an isError result stored and replayed, a JSON-RPC error released and run "
          f"again, a --config gateway on HTTP replayed across sessions; {len(lines)} side "
          f"effects in the ledger")


anyio.run(main)
