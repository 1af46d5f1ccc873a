"""An agent-like loop through the gateway, with the official Python SDK: timeouts shorter than
the tool, retries with reworded arguments, concurrent duplicates, and a resumed agent replaying
its steps in a new session. The ledger must show every step's side effect exactly once, and
every answered step must replay its own result.

    python agent_loop.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import anyio
from ledger_gateway import params as gateway_params
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

params = gateway_params()


def step_meta(task, step):
    return {"io.idemdb/task": task, "io.idemdb/step": step}


def text(result):
    return result.content[0].text


async def main():
    answered = {}  # step -> the result text it was first answered with
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()

        # Step 1: the model's call times out (the tool takes 1.5 s), then it retries with
        # reworded arguments: the retry waits for the first and replays its result.
        try:
            await s.call_tool("create_incident", {"title": "DB down", "seconds": 1.5},
                              read_timeout_seconds=0.3, meta=step_meta("task-9", 1))
            raise AssertionError("the first call should time out")
        except MCPError as e:
            assert "time" in str(e).lower(), e
        retry = await s.call_tool("create_incident", {"title": "Database is down", "seconds": 1.5},
                                  read_timeout_seconds=10.0, meta=step_meta("task-9", 1))
        assert not retry.is_error
        assert retry.meta["io.idemdb/replayed"] is True, retry.meta
        assert retry.meta["io.idemdb/argumentsChanged"] is True, retry.meta
        answered[1] = text(retry)

        # Step 2: two duplicates at once (a harness that retried while the first was running).
        results = []

        async def call(title):
            results.append(await s.call_tool(
                "create_incident", {"title": title, "seconds": 0.5},
                read_timeout_seconds=10.0, meta=step_meta("task-9", "2")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "Disk full")
            tg.start_soon(call, "Disk is full")
        assert len({text(r) for r in results}) == 1, [text(r) for r in results]
        assert sorted(bool(r.meta.get("io.idemdb/replayed")) for r in results) == [False, True]
        answered[2] = text(results[0])

        # Step 3: a plain call; an unkeyed read-only call passes through.
        third = await s.call_tool("create_incident", {"title": "Cert expiring"},
                                  read_timeout_seconds=10.0, meta=step_meta("task-9", 3))
        assert "io.idemdb/replayed" not in third.meta, third.meta
        answered[3] = text(third)

        # Step 4 under a key the harness minted itself, used as it is.
        given = {"io.idemdb/key": "harness-run-9/call-4"}
        fourth = await s.call_tool("create_incident", {"title": "Queue backlog"},
                                   read_timeout_seconds=10.0, meta=given)
        again = await s.call_tool("create_incident", {"title": "Queue backed up"},
                                  read_timeout_seconds=10.0, meta=given)
        assert text(again) == text(fourth) and again.meta["io.idemdb/replayed"] is True

    # The agent resumes in a new session (a new gateway process on the same store) and replays
    # its steps: each answers as it did, and nothing runs again.
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        for step, first in answered.items():
            again = await s.call_tool("create_incident", {"title": f"step {step} again"},
                                      read_timeout_seconds=10.0, meta=step_meta("task-9", step))
            assert text(again) == first, (step, text(again), first)
            assert again.meta["io.idemdb/replayed"] is True
        lines = text(await s.call_tool("ledger", {}, read_timeout_seconds=10.0)).splitlines()

    keys = [line.split("\t")[1] for line in lines]
    assert len(lines) == 4, lines
    derived = [f"tc1:task-9:{n}:create_incident" for n in (1, 2, 3)]
    assert sorted(keys) == sorted(derived + ["harness-run-9/call-4"]), keys
    print(f"agent loop: 4 steps, {len(lines)} side effects in the ledger (0 duplicates), "
          f"every step replayed its own result")


anyio.run(main)
