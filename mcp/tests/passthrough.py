"""Pass-through, checked with the official Python SDK: the same session with server-everything,
once directly and once through `idemdb-mcp serve`, must see the same tools (annotations and
every other field), the same tool results, and the progress notifications of a long operation.

    python passthrough.py GATEWAY_BINARY NODE_MODULES STORE_DIR
"""

import sys

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

gateway, node_modules, store_dir = sys.argv[1:4]
everything = [f"{node_modules}/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]


async def session_view(params):
    """What one session sees: the tools as JSON, some tool results, the progress it was told."""
    progress = []

    async def on_progress(done, total, message):
        progress.append((done, total))

    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
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
        return {
            "protocol": init.protocol_version,
            "server": init.server_info.name,
            "tools": [t.model_dump(mode="json", by_alias=True) for t in tools.tools],
            "echo": echo.model_dump(mode="json", by_alias=True),
            "sum": total.model_dump(mode="json", by_alias=True),
            "long": long.model_dump(mode="json", by_alias=True),
            "progress": progress,
        }


async def main():
    direct = await session_view(StdioServerParameters(command="node", args=everything))
    through = await session_view(
        StdioServerParameters(
            command=gateway,
            args=["serve", "--store", f"{store_dir}/gateway.idem", "--", "node", *everything],
        )
    )
    for part in ["protocol", "server", "tools", "echo", "sum", "long"]:
        assert direct[part] == through[part], f"{part}: {direct[part]!r} != {through[part]!r}"
    assert len(through["progress"]) == 4, through["progress"]
    assert through["progress"] == direct["progress"], (direct["progress"], through["progress"])
    print(
        f"pass-through: {len(through['tools'])} tools identical, echo/sum/long results identical, "
        f"{len(through['progress'])} progress notifications"
    )


anyio.run(main)
