"""What the ledger tests share: the gateway in front of `ledger_server.py`, from the command
line the Rust tests give (`GATEWAY_BINARY PYTHON STORE_DIR`)."""

import json
import os
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

gateway, python, store_dir = sys.argv[1:4]
store_dir = os.path.abspath(store_dir)
ledger_path = os.path.join(store_dir, "ledger.txt")
# The gateway's store: a file in the test's directory, or the database IDEMDB_MCP_STORE names.
store = os.environ.get("IDEMDB_MCP_STORE") or os.path.join(store_dir, "gateway.idem")
_here = os.path.dirname(os.path.abspath(__file__))


def params(*options):
    """The gateway (with `options` before `--`) in front of the ledger server, as the SDK's
    stdio client starts it."""
    return StdioServerParameters(
        command=gateway,
        args=[
            "serve", "--store", store, "--tenant", "agent-1",
            *options, "--", python, os.path.join(_here, "ledger_server.py"), ledger_path,
        ],
    )


def ledger_lines():
    with open(ledger_path) as f:
        return f.read().splitlines()


def idemdb(*args):
    """Runs the operator's `idemdb` command (IDEMDB_CLI) with `--json`; returns its answer."""
    out = subprocess.run([os.environ["IDEMDB_CLI"], "--json", *args], capture_output=True,
                         text=True)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return json.loads(out.stdout)


def resolve_unknown(result_text):
    """What an operator does for a step whose outcome is unknown: lists the orphans of the
    gateway's store (there must be one), finds out (here: the ledger says the side effect
    happened) and completes the step with the tool result the retry should get."""
    orphans = idemdb("list", store, "--state", "orphan")
    assert len(orphans) == 1, orphans
    orphan = orphans[0]
    body = os.path.join(store_dir, "result.json")
    with open(body, "w") as f:
        # The ledger's tools declare an output schema: a result must carry structuredContent.
        json.dump({"content": [{"type": "text", "text": result_text}],
                   "structuredContent": {"result": result_text}, "isError": False}, f)
    idemdb("resolve", store, orphan["tenant"], orphan["endpoint"], orphan["key"],
           "--fence", str(orphan["fence"]), "--complete", "200", "--body", body)
    return orphan


async def replayed_text(params, tool, arguments, meta):
    """A new session's call: its result's text, having checked it is a replay."""
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        result = await s.call_tool(tool, arguments, read_timeout_seconds=10.0, meta=meta)
        assert result.meta and result.meta.get("io.idemdb/replayed") is True, result
        return result.content[0].text


async def refusal(params, tool, arguments, meta):
    """The JSON-RPC error a new session's call of `tool` gets (it must get one)."""
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        try:
            result = await s.call_tool(tool, arguments, read_timeout_seconds=10.0, meta=meta)
        except MCPError as e:
            return e.error
        raise AssertionError(f"{tool} was answered: {result}")
