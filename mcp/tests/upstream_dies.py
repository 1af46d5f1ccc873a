"""The upstream dies mid-call (after its side effect, before its answer), with the official
Python SDK: the caller is told the outcome is unknown (-32002); a retry, in a new gateway
process on the same store, is told so too, at once (not after --wait), and not executed again;
the operator lists the step with `idemdb list --state orphan`, settles it with `idemdb
resolve`, and the next retry replays what the operator stored. The ledger keeps one line.

    python upstream_dies.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import time

import anyio
from ledger_gateway import ledger_lines, refusal, replayed_text, resolve_unknown
from ledger_gateway import params as gateway_params

params = gateway_params("--wait", "10")
meta = {"io.idemdb/task": "task-5", "io.idemdb/step": 4}
arguments = {"title": "page on-call"}


async def attempt():
    """One session's call of step 4: the JSON-RPC error it gets."""
    return await refusal(params, "create_and_die", arguments, meta)


async def main():
    first = await attempt()
    assert first.code == -32002 and "unknown" in first.message, first
    started = time.monotonic()
    retry = await attempt()
    took = time.monotonic() - started
    assert retry.code == -32002 and "unknown" in retry.message, retry
    assert took < 5, f"the retry waited {took:.2f} s for a call that is known lost"
    orphan = resolve_unknown("INC-1: page on-call (resolved by the operator)")
    assert orphan["key"] == "tc1:task-5:4:create_and_die", orphan
    text = await replayed_text(params, "create_and_die", arguments, meta)
    assert text == "INC-1: page on-call (resolved by the operator)", text
    lines = ledger_lines()
    assert lines == ["page on-call\ttc1:task-5:4:create_and_die"], lines
    print(f"upstream died mid-call: told unknown ({first.code}); the retry was not run and was "
          f"told at once ({retry.code} in {took:.2f} s, --wait 10); resolved by the operator, "
          f"then replayed; {len(lines)} side effect in the ledger")


anyio.run(main)
