"""Two gateway processes on one PostgreSQL database (official Python SDK clients, the ledger
server behind each): a duplicate sent to the other gateway while the first call runs waits for
it and replays its result; a keyed call that outlives its lease (`--lease 1`, a 3 s tool) keeps
renewing it, so it is never listed stale and completes; a resumed agent in a third gateway
process replays its steps. The ledger holds one line per step.

    IDEMDB_MCP_STORE=postgres://... python two_gateways.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import os
import uuid

import anyio
from ledger_gateway import idemdb, ledger_lines, store
from ledger_gateway import params as gateway_params
from mcp import ClientSession, stdio_client

assert store.startswith("postgres"), store
task = f"task-{uuid.uuid4().hex[:12]}"
tool = "create_incident"


def meta(step):
    return {"io.idemdb/task": task, "io.idemdb/step": step}


async def call(params, step, arguments, timeout=20.0):
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return await s.call_tool(tool, arguments, read_timeout_seconds=timeout, meta=meta(step))


async def main():
    one, two = gateway_params("--wait", "10"), gateway_params("--wait", "10")
    # 1. The first gateway runs step 1 (1.5 s); the second gets the duplicate 0.5 s in.
    results = {}

    async def first():
        results["first"] = await call(one, 1, {"title": "DB down", "seconds": 1.5})

    async def duplicate():
        await anyio.sleep(0.5)
        results["duplicate"] = await call(two, 1, {"title": "Database is down", "seconds": 1.5})

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(duplicate)
    texts = {name: r.content[0].text for name, r in results.items()}
    assert texts["first"] == texts["duplicate"], texts
    replays = [name for name, r in results.items()
               if r.meta and r.meta.get("io.idemdb/replayed") is True]
    assert len(replays) == 1, (replays, results)

    # 2. A 3 s call under a 1 s lease: renewed every third of it, so never stale.
    leased = gateway_params("--wait", "10", "--lease", "1")
    stale_seen = []

    async def watch():
        for _ in range(10):
            await anyio.sleep(0.25)
            stale = idemdb("list", store, "--state", "stale", "--state", "orphan",
                           "--tenant", "agent-1")
            stale_seen.extend(r for r in stale if r["key"].startswith(f"tc1:{task}:2:"))

    async def slow():
        results["slow"] = await call(leased, 2, {"title": "slow", "seconds": 3.0})

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        tg.start_soon(watch)
    assert not stale_seen, stale_seen
    assert not results["slow"].is_error and not (results["slow"].meta or {}).get(
        "io.idemdb/replayed"), results["slow"]

    # 3. A resumed agent, in a new gateway process, replays both steps.
    for step, name in [(1, "first"), (2, "slow")]:
        again = await call(gateway_params(), step, {"title": "resumed"})
        assert again.meta.get("io.idemdb/replayed") is True, again
        assert again.content[0].text == results[name].content[0].text, (again, results[name])

    lines = [line for line in ledger_lines() if task in line]
    assert len(lines) == 2, lines
    print(f"two gateways on one database: the duplicate replayed across instances, a 3 s call "
          f"under a 1 s lease never listed stale, a resumed agent replayed 2 steps; "
          f"{len(lines)} side effects in the ledger")


anyio.run(main)
