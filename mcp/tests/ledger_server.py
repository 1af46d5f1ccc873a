"""An upstream tool server with a side effect and a ledger of it (official Python SDK).

`create_incident` appends one line to the ledger per execution: the title and the key the
gateway forwarded in `_meta["io.idemdb/key"]`; it sleeps `seconds` first (a slow tool that a
client gives up on), and `answer_after` seconds between its side effect and its answer. `create_and_die` appends its line, then the whole server exits before it
answers. `unavailable` writes nothing and answers a JSON-RPC error (an incident system that is
down: the gateway releases the key), or with `fail` false creates the incident. `reject` has
its side effect, then fails as a tool (an `isError` result). `ledger` (read-only) returns the
ledger's lines.

    python ledger_server.py LEDGER_PATH
"""

import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations

LEDGER = sys.argv[1]
app = MCPServer("ledger")


@app.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
async def create_incident(
    title: str, ctx: Context, seconds: float = 0.0, answer_after: float = 0.0
) -> str:
    await anyio.sleep(seconds)
    meta = ctx.request_context.meta or {}
    key = meta.get("io.idemdb/key")
    with open(LEDGER, "a") as f:
        f.write(f"{title}\t{key}\n")
    with open(LEDGER) as f:
        number = sum(1 for _ in f)
    await anyio.sleep(answer_after)
    return f"INC-{number}: {title}"


@app.tool(annotations=ToolAnnotations(readOnlyHint=False))
async def create_and_die(title: str, ctx: Context) -> str:
    """Has its side effect, then the server dies before it answers."""
    meta = ctx.request_context.meta or {}
    with open(LEDGER, "a") as f:
        f.write(f"{title}\t{meta.get('io.idemdb/key')}\n")
    os._exit(1)


@app.tool(annotations=ToolAnnotations(readOnlyHint=False))
def unavailable(title: str, ctx: Context, fail: bool = True) -> str:
    """Answers a JSON-RPC error, not a tool result: nothing happened. With `fail` false, the
    system is back: the incident is created."""
    if fail:
        raise MCPError(code=-32050, message=f"the incident system is unavailable ({title})")
    return record(title, ctx)


@app.tool(annotations=ToolAnnotations(readOnlyHint=False))
def reject(title: str, ctx: Context) -> str:
    """Has its side effect (a rejection is recorded), then fails as a tool: an `isError`
    result, the tool's own outcome."""
    record(title, ctx)
    raise ToolError(f"rejected: {title}")


def record(title, ctx):
    """Appends the ledger's line for `title` under the forwarded key; returns the answer."""
    key = (ctx.request_context.meta or {}).get("io.idemdb/key")
    with open(LEDGER, "a") as f:
        f.write(f"{title}\t{key}\n")
    with open(LEDGER) as f:
        return f"INC-{sum(1 for _ in f)}: {title}"


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def ledger() -> str:
    try:
        with open(LEDGER) as f:
            return f.read()
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    app.run()
