"""The gateway is SIGKILLed while a keyed call runs (after the tool's side effect, before its
answer), then started again on the same store, with the official Python SDK: the retry is not
executed again (the step's outcome is unknown to the gateway: it answers -32002 at once until
the step is resolved); the operator resolves it with `idemdb`, the next retry replays that, and
the ledger holds the one side effect.

    python gateway_killed.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import os
import signal
import subprocess

import anyio
import time

from ledger_gateway import ledger_lines, refusal, replayed_text, resolve_unknown, store_dir
from ledger_gateway import params as gateway_params
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

params = gateway_params("--wait", "10")
meta = {"io.idemdb/task": "task-6", "io.idemdb/step": 1}


def gateway_pids():
    """The gateway processes serving this test's store."""
    out = subprocess.run(["pgrep", "-f", f"idemdb-mcp serve --store {store_dir}"],
                         capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


async def first_attempt():
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()

        async def kill_soon():
            await anyio.sleep(0.5)
            for pid in gateway_pids():
                os.kill(pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            try:
                await s.call_tool("create_incident", {"title": "DB down", "answer_after": 2.0},
                                  read_timeout_seconds=5.0, meta=meta)
                raise AssertionError("the call was answered by a killed gateway")
            except (MCPError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
                pass


async def main():
    try:
        await first_attempt()
    except BaseException as e:  # the session's streams may end in any way once killed
        print(f"first session ended: {type(e).__name__}")
    started = time.monotonic()
    error = await refusal(params, "create_incident", {"title": "Database down"}, meta)
    took = time.monotonic() - started
    assert error.code == -32002 and "unknown" in error.message, error
    assert took < 5, f"the retry waited {took:.2f} s for a call that is known lost"
    resolve_unknown("INC-1: DB down (found by the operator)")
    text = await replayed_text(params, "create_incident", {"title": "Database down"}, meta)
    assert text == "INC-1: DB down (found by the operator)", text
    lines = ledger_lines()
    assert lines == ["DB down\ttc1:task-6:1:create_incident"], lines
    print(f"gateway killed mid-call: the retry was not run ({error.code} in {took:.2f} s, "
          f"--wait 10); resolved by the operator, then replayed; "
          f"{len(lines)} side effect in the ledger")


anyio.run(main)
