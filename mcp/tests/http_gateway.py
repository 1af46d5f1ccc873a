"""The gateway on Streamable HTTP (`idemdb-mcp serve --listen`), driven by the official Python
SDK's client (`mcp.Client`, which probes `server/discover` first and falls back to
`initialize`) in front of `ledger_server.py`: tenants are kept apart, duplicates from two
sessions at once run once, a call whose client timed out still finishes and its retry in a new
session replays it. Refusals are checked with a raw HTTP client (urllib): no tenant 400, a
foreign Origin 403, another tenant's session 403, a deleted session 404, `server/discover` 404
with -32601, `--max-sessions 1` 503, and `--session-idle 1` ending an idle session.

    python http_gateway.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from listening import start_listening

gateway, python, store_dir = sys.argv[1:4]
store_dir = os.path.abspath(store_dir)
ledger_path = os.path.join(store_dir, "ledger.txt")
server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ledger_server.py")
TENANT = "x-idemdb-tenant"


def start_gateway(store, *options):
    """Starts the gateway on a free port; returns the process and its URL (read from the line
    it prints once listening). Its stderr is drained on a thread, so it never blocks."""
    return start_listening(
        [gateway, "serve", "--listen", "127.0.0.1:0", "--store", os.path.join(store_dir, store),
         *options, "--", python, server, ledger_path])


def raw(url, method="POST", body=None, **headers):
    """A raw HTTP request: (status, headers, body text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    request.add_header("accept", "application/json, text/event-stream")
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"}}}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


def raw_session(url, tenant):
    status, headers, body = raw(url, body=INITIALIZE, **{TENANT: tenant})
    assert status == 200 and '"result"' in body, (status, body)
    return headers["mcp-session-id"]


@asynccontextmanager
async def client(url, tenant):
    """The SDK's default client (mode auto: server/discover, then initialize) as `tenant`."""
    async with httpx2.AsyncClient(headers={TENANT: tenant},
                                  timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            yield c


def step(task, n):
    return {"io.idemdb/task": task, "io.idemdb/step": n}


def text(result):
    return result.content[0].text


def ledger_lines():
    with open(ledger_path) as f:
        return f.read().splitlines()


async def call(url, tenant, title, meta, **options):
    async with client(url, tenant) as c:
        assert c.session.protocol_version == "2025-11-25", c.session.protocol_version
        return await c.call_tool("create_incident", {"title": title}, meta=meta,
                                 read_timeout_seconds=options.pop("timeout", 20.0),
                                 **options)


async def tenants_are_kept_apart(url):
    first = {t: await call(url, t, f"{t}: API down", step("shared", 1)) for t in "AB"}
    assert text(first["A"]) != text(first["B"]), "each tenant ran its own step"
    for t in "AB":
        again = await call(url, t, f"{t}: the API is down", step("shared", 1))
        assert text(again) == text(first[t]), (t, text(again), text(first[t]))
        assert again.meta["io.idemdb/replayed"] is True, again.meta
    session_a = raw_session(url, "A")
    status, _, body = raw(url, body=PING, **{TENANT: "B", "mcp-session-id": session_a})
    assert status == 403, (status, body)
    status, _, _ = raw(url, body=PING, **{TENANT: "A", "mcp-session-id": session_a})
    assert status == 200, status


async def duplicates_in_two_sessions_run_once(url):
    results = []

    async def one(title):
        results.append(await call(url, "A", title, step("dup", 1), timeout=20.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "Disk full")
        tg.start_soon(one, "Disk is full")
    assert len({text(r) for r in results}) == 1, [text(r) for r in results]
    replayed = sorted(bool(r.meta.get("io.idemdb/replayed")) for r in results)
    assert replayed == [False, True], [r.meta for r in results]


async def a_timed_out_call_finishes_and_replays(url):
    async with client(url, "A") as c:
        try:
            await c.call_tool("create_incident", {"title": "Cert expired", "seconds": 1.5},
                              read_timeout_seconds=0.3, meta=step("slow", 1))
            raise AssertionError("the call should time out")
        except MCPError as e:
            assert "time" in str(e).lower(), e
    # The session is gone (the client deleted it); the call still runs to its end and is
    # stored, and the retry in a new session waits for it and replays it.
    retry = await call(url, "A", "The cert has expired", step("slow", 1))
    assert retry.meta["io.idemdb/replayed"] is True, retry.meta
    assert text(retry).endswith(": Cert expired"), text(retry)
    lines = [l for l in ledger_lines() if l.endswith("tc1:slow:1:create_incident")]
    assert len(lines) == 1, lines


def refusals(url):
    status, _, _ = raw(url, body=INITIALIZE)
    assert status == 400, f"no tenant: {status}"
    status, _, _ = raw(url, body=INITIALIZE, origin="http://evil.example", **{TENANT: "A"})
    assert status == 403, f"foreign origin: {status}"
    session = raw_session(url, "A")
    status, _, _ = raw(url, "DELETE", **{TENANT: "A", "mcp-session-id": session})
    assert status == 200, f"delete: {status}"
    status, _, _ = raw(url, body=PING, **{TENANT: "A", "mcp-session-id": session})
    assert status == 404, f"deleted session: {status}"
    discover = {"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}}
    status, _, body = raw(url, body=discover, **{TENANT: "A", "mcp-protocol-version": "2026-07-28"})
    assert status == 404 and json.loads(body)["error"]["code"] == -32601, (status, body)


def limits():
    proc, url = start_gateway("limits.idem", "--max-sessions", "1", "--session-idle", "1")
    try:
        session = raw_session(url, "A")
        status, _, _ = raw(url, body=INITIALIZE, **{TENANT: "A"})
        assert status == 503, f"a second session beyond --max-sessions 1: {status}"
        time.sleep(2.5)
        status, _, _ = raw(url, body=PING, **{TENANT: "A", "mcp-session-id": session})
        assert status == 404, f"an idle session: {status}"
        raw_session(url, "A")  # its place is free again
    finally:
        proc.kill()
        proc.wait()


async def main():
    proc, url = start_gateway("g.idem")
    try:
        await tenants_are_kept_apart(url)
        await duplicates_in_two_sessions_run_once(url)
        await a_timed_out_call_finishes_and_replays(url)
        refusals(url)
    finally:
        proc.kill()
        proc.wait()
    limits()
    lines = ledger_lines()
    assert len(lines) == 4, lines
    print(
        "http gateway: tenants kept apart, duplicates in two sessions ran once, a timed-out "
        "call replayed in a new session; refusals 400/403/403/404/404+-32601/503/idle 404; "
        f"{len(lines)} side effects in the ledger (0 duplicates)"
    )


anyio.run(main)
