"""Pass-through, checked with the official Python SDK: the same session with server-everything,
directly, through `idemdb-mcp serve` on stdio, and through `idemdb-mcp serve --listen` on
Streamable HTTP, must see the same tools (annotations and every other field), the same tool
results, the progress notifications of a long operation, the same resources and prompts, and a
server request (`roots/list`) reaching the client and its answer reaching the server.

    python passthrough.py GATEWAY_BINARY NODE_MODULES STORE_DIR
"""

import sys
from contextlib import asynccontextmanager

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ListRootsResult, Root
from listening import start_listening

gateway, node_modules, store_dir = sys.argv[1:4]
everything = [f"{node_modules}/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]
ROOT = "file:///work/passthrough-root"


def dump(value):
    return value.model_dump(mode="json", by_alias=True)


async def session_view(connect):
    """What one session sees: the tools as JSON, some tool results, the progress it was told,
    resources and prompts."""
    progress = []

    async def on_progress(done, total, message):
        progress.append((done, total))

    async with connect() as (r, w), ClientSession(r, w) as s:
        init = await s.initialize()
        tools = await s.list_tools()
        echo = await s.call_tool("echo", {"message": "through"}, read_timeout_seconds=10.0)
        total = await s.call_tool("get-sum", {"a": 2, "b": 40}, read_timeout_seconds=10.0)
        long = await s.call_tool(
            "trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            read_timeout_seconds=20.0,
            progress_callback=on_progress,
        )
        resources = await s.list_resources()
        first = resources.resources[0]
        read = await s.read_resource(first.uri)
        templates = await s.list_resource_templates()
        prompts = await s.list_prompts()
        prompt = await s.get_prompt(prompts.prompts[0].name, {})
        return {
            "protocol": init.protocol_version,
            "server": init.server_info.name,
            "tools": [dump(t) for t in tools.tools],
            "echo": dump(echo),
            "sum": dump(total),
            "long": dump(long),
            "progress": progress,
            "resources": [dump(r) for r in resources.resources],
            "read": dump(read),
            "templates": [dump(t) for t in templates.resource_templates],
            "prompts": [dump(p) for p in prompts.prompts],
            "prompt": dump(prompt),
        }


async def roots_view(connect):
    """A session whose client has roots: server-everything asks for them (`roots/list`, a
    server request) and its `get-roots-list` tool reports what the client answered."""
    asked = []

    async def list_roots(context):
        asked.append(True)
        return ListRootsResult(roots=[Root(uri=ROOT, name="passthrough")])

    async with connect() as (r, w), ClientSession(r, w, list_roots_callback=list_roots) as s:
        await s.initialize()
        result = await s.call_tool("get-roots-list", {}, read_timeout_seconds=10.0)
        return {"asked": bool(asked), "roots": dump(result)}


def stdio(params):
    return lambda: stdio_client(params)


def start_http_gateway():
    """The gateway on Streamable HTTP in front of server-everything; returns it and its URL."""
    return start_listening(
        [gateway, "serve", "--listen", "127.0.0.1:0", "--store", f"{store_dir}/http.idem",
         "--", "node", *everything])


def http(url):
    @asynccontextmanager
    async def connect():
        async with httpx2.AsyncClient(headers={"x-idemdb-tenant": "passthrough"},
                                      timeout=httpx2.Timeout(30.0, read=300.0)) as client:
            async with streamable_http_client(url, http_client=client) as streams:
                yield streams

    return connect


async def main():
    direct = stdio(StdioServerParameters(command="node", args=everything))
    through = stdio(StdioServerParameters(
        command=gateway,
        args=["serve", "--store", f"{store_dir}/gateway.idem", "--", "node", *everything],
    ))
    proc, url = start_http_gateway()
    try:
        views = {
            "direct": await session_view(direct),
            "stdio": await session_view(through),
            "http": await session_view(http(url)),
        }
        roots = {
            "direct": await roots_view(direct),
            "stdio": await roots_view(through),
            "http": await roots_view(http(url)),
        }
    finally:
        proc.kill()
        proc.wait()
    direct_view = views["direct"]
    for column in ["stdio", "http"]:
        view = views[column]
        for part in ["protocol", "server", "tools", "echo", "sum", "long", "resources", "read",
                     "templates", "prompts", "prompt"]:
            assert direct_view[part] == view[part], \
                f"{column} {part}: {direct_view[part]!r} != {view[part]!r}"
        assert len(view["progress"]) == 4, (column, view["progress"])
        assert view["progress"] == direct_view["progress"], (column, view["progress"])
        assert roots[column] == roots["direct"], (column, roots[column], roots["direct"])
    assert roots["direct"]["asked"] and ROOT in str(roots["direct"]["roots"]), roots["direct"]
    print(
        f"pass-through (stdio and Streamable HTTP): {len(views['http']['tools'])} tools identical, "
        f"echo/sum/long results identical, {len(views['http']['progress'])} progress "
        f"notifications, {len(views['http']['resources'])} resources and "
        f"{len(views['http']['prompts'])} prompts identical, roots/list answered by the client"
    )


anyio.run(main)
