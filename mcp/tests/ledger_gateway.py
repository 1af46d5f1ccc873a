"""What the ledger tests share: the gateway in front of `ledger_server.py`, from the command
line the Rust tests give (`GATEWAY_BINARY PYTHON STORE_DIR`)."""

import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

gateway, python, store_dir = sys.argv[1:4]
store_dir = os.path.abspath(store_dir)
ledger_path = os.path.join(store_dir, "ledger.txt")
_here = os.path.dirname(os.path.abspath(__file__))


def params(*options):
    """The gateway (with `options` before `--`) in front of the ledger server, as the SDK's
    stdio client starts it."""
    return StdioServerParameters(
        command=gateway,
        args=[
            "serve", "--store", os.path.join(store_dir, "gateway.idem"), "--tenant", "agent-1",
            *options, "--", python, os.path.join(_here, "ledger_server.py"), ledger_path,
        ],
    )


def ledger_lines():
    with open(ledger_path) as f:
        return f.read().splitlines()


async def refusal(params, tool, arguments, meta):
    """The JSON-RPC error a new session's call of `tool` gets (it must get one)."""
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        try:
            result = await s.call_tool(tool, arguments, read_timeout_seconds=10.0, meta=meta)
        except MCPError as e:
            return e.error
        raise AssertionError(f"{tool} was answered: {result}")
