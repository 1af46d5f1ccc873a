"""A tool server with a side effect anyone can count: `open_ticket` appends a line to a file
(the ledger) each time it runs, with the idempotency key the gateway passed on. Run by
agent_loop.py behind idemdb-mcp (official Python MCP SDK).

    python tool_server.py LEDGER_PATH
"""

import sys

from mcp.server.mcpserver import Context, MCPServer

LEDGER = sys.argv[1]
app = MCPServer("tickets")


@app.tool()
async def open_ticket(summary: str, ctx: Context) -> str:
    key = (ctx.request_context.meta or {}).get("io.idemdb/key")
    with open(LEDGER, "a") as f:
        f.write(f"{key}\t{summary}\n")
    with open(LEDGER) as f:
        return f"TICKET-{sum(1 for _ in f)}"


if __name__ == "__main__":
    app.run()
