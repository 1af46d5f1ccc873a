"""One gateway in front of several upstreams (`serve --config`), with the official Python SDK as
the client. The config's upstreams: the ledger server on stdio (`ledger`), the same server on
Streamable HTTP (`web`, started here on a free 127.0.0.1 port), server-everything on stdio
(`everything`), and a payment server that deduplicates by the forwarded key and dies once
after its side effect (`pay`, `honoursKey: true`, `readOnlyTools: ["receipts"]`,
`trustReadOnlyHints: false`).

Checked: every tool is its upstream's, named UPSTREAM__tool and otherwise unchanged; progress,
prompts and resources pass through from server-everything; one step on two upstreams' tools is
two calls with two side effects; a tool in readOnlyTools is not keyed, a tool marked read-only by
an upstream whose hints are not trusted is; an upstream that ended answers later calls with
-32000 while the others keep working. With honoursKey, the lost charge retried in a new gateway
process is forwarded again under the same key and the payment server's ledger keeps one charge;
with honoursKey off, the retry is refused (the outcome is unknown) and nothing is forwarded.

PART is `hub` (all but the last check) or `honours-key` (the retry with honoursKey on).

    python config_gateway.py GATEWAY_BINARY PYTHON NODE_MODULES PART STORE_DIR
"""

import json
import os
import socket
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

gateway, python, node_modules, part, store_dir = sys.argv[1:6]
store_dir = os.path.abspath(store_dir)
here = os.path.dirname(os.path.abspath(__file__))
everything = [f"{node_modules}/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]
ledger_path = os.path.join(store_dir, "ledger-stdio.txt")
web_ledger_path = os.path.join(store_dir, "ledger-http.txt")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


web_log_path = os.path.join(store_dir, "ledger-http.log")


def start_http_ledger(port):
    """The HTTP ledger server; its access log (uvicorn's) shows the gateway's HTTP requests."""
    log = open(web_log_path, "w")
    server = subprocess.Popen(
        [python, os.path.join(here, "ledger_http_server.py"), web_ledger_path, str(port)],
        stdout=log, stderr=log,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError("the HTTP ledger server did not start")


def config_file(name, servers):
    path = os.path.join(store_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"mcpServers": servers}, f)
    return path


def pay_server(directory, honours_key):
    os.makedirs(directory, exist_ok=True)
    return {"command": python, "args": [os.path.join(here, "pay_server.py"), directory],
            "honoursKey": honours_key, "readOnlyTools": ["receipts"],
            "trustReadOnlyHints": False, "description": "payments"}


def gateway_params(config):
    return StdioServerParameters(command=gateway, args=[
        "serve", "--store", os.path.join(store_dir, "gateway.idem"), "--tenant", "agent-1",
        "--wait", "1", "--config", config])


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def meta(task, step):
    return {"io.idemdb/task": task, "io.idemdb/step": step}


def dump(model):
    return model.model_dump(mode="json", by_alias=True)


def text(result):
    return result.content[0].text


async def call(s, tool, arguments, task_step=None):
    return await s.call_tool(tool, arguments, read_timeout_seconds=20.0,
                             meta=meta(*task_step) if task_step else None)


async def refused(s, tool, arguments, task_step=None):
    try:
        result = await call(s, tool, arguments, task_step)
    except MCPError as e:
        return e.error
    raise AssertionError(f"{tool} was answered: {result}")


async def direct_view(params):
    """What a session sees of a server directly: its tools, prompts and resources."""
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        view = {"tools": [dump(t) for t in (await s.list_tools()).tools]}
        if params.command == "node":
            view["prompts"] = [dump(p) for p in (await s.list_prompts()).prompts]
            view["simple"] = dump(await s.get_prompt("simple-prompt"))
            view["resources"] = [dump(r) for r in (await s.list_resources()).resources]
            view["templates"] = [
                dump(t) for t in (await s.list_resource_templates()).resource_templates]
            view["first"] = dump(await s.read_resource(view["resources"][0]["uri"]))
        return view


def prefixed(items, prefix):
    return [{**item, "name": f"{prefix}__{item['name']}"} for item in items]


async def several_upstreams(config):
    everything_direct = await direct_view(StdioServerParameters(command="node", args=everything))
    ledger_direct = await direct_view(StdioServerParameters(
        command=python, args=[os.path.join(here, "ledger_server.py"), ledger_path]))
    progress = []

    async def on_progress(done, total, message):
        progress.append((done, total))

    async with stdio_client(gateway_params(config)) as (r, w), ClientSession(r, w) as s:
        init = await s.initialize()
        assert init.server_info.name == "idemdb-mcp", init.server_info
        caps = init.capabilities
        assert caps.tools is not None and caps.prompts is not None and caps.resources is not None

        # Tools: each upstream's, prefixed, nothing else changed.
        tools = [dump(t) for t in (await s.list_tools()).tools]
        by_upstream = {}
        for tool in tools:
            upstream, _, _ = tool["name"].partition("__")
            by_upstream.setdefault(upstream, []).append(tool)
        assert by_upstream["everything"] == prefixed(everything_direct["tools"], "everything")
        assert by_upstream["ledger"] == prefixed(ledger_direct["tools"], "ledger")
        assert by_upstream["web"] == prefixed(ledger_direct["tools"], "web")
        assert sorted(t["name"] for t in by_upstream["pay"]) == [
            "pay__balance", "pay__charge", "pay__receipts"]
        assert len(by_upstream) == 4, list(by_upstream)

        # Progress, prompts and resources pass through from server-everything.
        long = await s.call_tool("everything__trigger-long-running-operation",
                                 {"duration": 1, "steps": 4}, read_timeout_seconds=20.0,
                                 progress_callback=on_progress)
        assert not long.is_error and len(progress) == 4, (long, progress)
        prompts = [dump(p) for p in (await s.list_prompts()).prompts]
        assert [p for p in prompts if p["name"].startswith("everything__")] == prefixed(
            everything_direct["prompts"], "everything"), prompts
        assert dump(await s.get_prompt("everything__simple-prompt")) == everything_direct["simple"]
        resources = [dump(r) for r in (await s.list_resources()).resources]
        assert resources == everything_direct["resources"], resources
        templates = [dump(t) for t in (await s.list_resource_templates()).resource_templates]
        assert templates == everything_direct["templates"], templates
        first = everything_direct["resources"][0]["uri"]
        assert dump(await s.read_resource(first)) == everything_direct["first"]
        # Made from a template (its text carries the time it was made).
        dynamic = dump(await s.read_resource("demo://resource/dynamic/text/7"))["contents"][0]
        assert dynamic["uri"] == "demo://resource/dynamic/text/7", dynamic
        assert dynamic["text"].startswith("Resource 7:"), dynamic
        try:
            await s.read_resource("nowhere://listed/by/none")
            raise AssertionError("a resource no upstream listed was read")
        except MCPError as e:
            assert e.error.code == -32002, e.error

        # One step on two upstreams' tools: two calls, two side effects, two keys.
        a = await call(s, "ledger__create_incident", {"title": "on stdio"}, ("t-two", 1))
        b = await call(s, "web__create_incident", {"title": "over http"}, ("t-two", 1))
        assert "io.idemdb/replayed" not in a.meta and "io.idemdb/replayed" not in b.meta
        assert lines(ledger_path) == ["on stdio\ttc1:t-two:1:ledger__create_incident"]
        assert lines(web_ledger_path) == ["over http\ttc1:t-two:1:web__create_incident"]

        # Which calls are keyed.
        receipts = await call(s, "pay__receipts", {}, ("t-ro", 1))
        assert text(receipts) == "no receipts; key None", text(receipts)
        assert "io.idemdb/key" not in (receipts.meta or {}), "readOnlyTools: never keyed"
        balance = await call(s, "pay__balance", {}, ("t-ro", 2))
        assert text(balance) == "balance 100; key tc1:t-ro:2:pay__balance", text(balance)
        assert balance.meta["io.idemdb/key"] == "tc1:t-ro:2:pay__balance", "untrusted hint"
        peek = await call(s, "ledger__ledger", {}, ("t-ro", 3))
        assert "io.idemdb/key" not in (peek.meta or {}), "a trusted readOnlyHint: not keyed"

        # The payment server dies after its charge, before its answer: unknown.
        lost = await refused(s, "pay__charge", {"amount": 42}, ("t-pay", 1))
        assert lost.code == -32002 and "unknown" in lost.message, lost
        assert len(lines(os.path.join(store_dir, "pay-on", "charges.txt"))) == 1

        # It ended: its later calls are refused at once; the others keep working.
        gone = await refused(s, "pay__balance", {}, ("t-ro", 4))
        assert gone.code == -32000, gone
        gone = await refused(s, "pay__receipts", {})
        assert gone.code == -32000, gone
        c = await call(s, "ledger__create_incident", {"title": "still here"}, ("t-two", 2))
        d = await call(s, "web__create_incident", {"title": "still there"}, ("t-two", 2))
        echo = await call(s, "everything__echo", {"message": "alive"})
        assert not (c.is_error or d.is_error or echo.is_error)
        assert len(lines(ledger_path)) == 2 and len(lines(web_ledger_path)) == 2
    return len(tools), len(progress)


async def http_upstream_gone(config, web):
    """The HTTP upstream's server goes away mid-session: its calls are refused with -32000
    (they never reached it), and the other upstreams keep working."""
    async with stdio_client(gateway_params(config)) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        await s.list_tools()
        before = len(lines(web_ledger_path))
        web.terminate()
        web.wait(timeout=10)
        refused_first = await refused(s, "web__create_incident", {"title": "gone"}, ("t-web", 1))
        assert refused_first.code == -32000 and "reached" in refused_first.message, refused_first
        refused_next = await refused(s, "web__create_incident", {"title": "gone"}, ("t-web", 2))
        assert refused_next.code == -32000 and "ended" in refused_next.message, refused_next
        still = await call(s, "ledger__create_incident", {"title": "still on stdio"}, ("t-web", 3))
        assert not still.is_error
        assert len(lines(web_ledger_path)) == before


async def retried_charge(config, pay_dir, task):
    """A charge lost when the payment server died, then retried in a new gateway process:
    what each got, and the payment server's attempts and charges."""
    async with stdio_client(gateway_params(config)) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        first = await refused(s, "pay__charge", {"amount": 42}, (task, 1))
    async with stdio_client(gateway_params(config)) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        try:
            retry = await call(s, "pay__charge", {"amount": 42}, (task, 1))
        except MCPError as e:
            retry = e.error
    attempts = lines(os.path.join(pay_dir, "attempts.txt"))
    charges = lines(os.path.join(pay_dir, "charges.txt"))
    return first, retry, attempts, charges


async def hub():
    port = free_port()
    web = start_http_ledger(port)
    try:
        config = config_file("hub", {
            "ledger": {"command": python,
                       "args": [os.path.join(here, "ledger_server.py"), ledger_path]},
            "web": {"url": f"http://127.0.0.1:{port}/mcp", "type": "http"},
            "everything": {"command": "node", "args": everything},
            "pay": pay_server(os.path.join(store_dir, "pay-on"), True),
        })
        tools, progress = await several_upstreams(config)
        # The gateway opened the server's GET stream, and deleted its session when it ended.
        log = open(web_log_path).read()
        assert '"GET /mcp HTTP/1.1" 200' in log, log
        assert '"DELETE /mcp HTTP/1.1" 200' in log, log
        await http_upstream_gone(config, web)
    finally:
        web.kill()
        web.wait(timeout=10)
    print(f"config gateway: 4 upstreams, {tools} tools prefixed and otherwise unchanged, "
          f"{progress} progress notifications; one step on two upstreams: 2 side effects; "
          f"an upstream that ended: -32000, the others kept working; the HTTP upstream's GET "
          f"stream opened, its session deleted, its server gone: -32000")

    # honoursKey off: the retry is refused, never forwarded.
    off_dir = os.path.join(store_dir, "pay-off")
    off = config_file("off", {"pay": pay_server(off_dir, False)})
    first, retry, attempts, charges = await retried_charge(off, off_dir, "t-off")
    assert first.code == -32002, first
    assert retry.code == -32002 and "unknown" in retry.message, retry
    assert len(attempts) == 1 and len(charges) == 1, (attempts, charges)
    print(f"honoursKey off: the lost charge ({first.code}) was not forwarded again on retry "
          f"({retry.code}): {len(attempts)} attempt, {len(charges)} charge")


async def honours_key():
    # honoursKey on: the retry is forwarded under the same key, and deduplicated upstream.
    on_dir = os.path.join(store_dir, "pay-on2")
    on = config_file("on", {"pay": pay_server(on_dir, True)})
    first, retry, attempts, charges = await retried_charge(on, on_dir, "t-on")
    assert first.code == -32002, first
    assert not isinstance(retry, Exception) and hasattr(retry, "content"), (
        f"the retry of a lost call to an upstream that honours the key was not forwarded: {retry}")
    assert text(retry) == "ch_1", text(retry)
    assert attempts == ["tc1:t-on:1:pay__charge\t42"] * 2, attempts
    assert len(charges) == 1, charges
    print(f"honoursKey on: the lost charge ({first.code}) was forwarded again under its key: "
          f"{len(attempts)} attempts, {len(charges)} charge")


anyio.run({"hub": hub, "honours-key": honours_key}[part])
