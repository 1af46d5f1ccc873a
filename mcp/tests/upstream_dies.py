"""The upstream dies mid-call (after its side effect, before its answer), with the official
Python SDK: the caller is told the outcome is unknown, and a retry, in a new gateway process on
the same store, is not executed again: the ledger keeps one line.

    python upstream_dies.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import anyio
from ledger_gateway import ledger_lines, refusal
from ledger_gateway import params as gateway_params

params = gateway_params("--wait", "1")
meta = {"io.idemdb/task": "task-5", "io.idemdb/step": 4}


async def attempt():
    """One session's call of step 4: the JSON-RPC error it gets."""
    return await refusal(params, "create_and_die", {"title": "page on-call"}, meta)


async def main():
    first = await attempt()
    assert first.code == -32002 and "unknown" in first.message, first
    retry = await attempt()
    assert retry.code == -32001 and "unknown" in retry.message, retry
    lines = ledger_lines()
    assert lines == ["page on-call\ttc1:task-5:4:create_and_die"], lines
    print(f"upstream died mid-call: told unknown ({first.code}), the retry was not run "
          f"({retry.code}); {len(lines)} side effect in the ledger")


anyio.run(main)
