"""An agent loop through idemdb-mcp whose fake model is unreliable the way real ones are: it
calls a tool, "times out", and calls it again with the arguments reworded. The harness gives
each call its step's key in `_meta`; the gateway runs each step once and replays it to the
retries. At the end, the ledger the tool writes shows one side effect per step.

    eval "$(scripts/mcp-sdks)" && cargo build --release -p idemdb-mcp
    $IDEMDB_MCP_PYTHON mcp/examples/agent_loop.py target/release/idemdb-mcp
"""

import os
import random
import sys
import tempfile

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

GATEWAY = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
REWORDINGS = ["{} (retry)", "Please: {}", "{}!", "URGENT {}"]


def fake_model_calls(step, summary, rng):
    """What a flaky model sends for one step: the call, then 0 to 3 reworded retries."""
    yield summary
    for _ in range(rng.randrange(4)):
        yield rng.choice(REWORDINGS).format(summary)


async def main():
    work = tempfile.mkdtemp(prefix="idemdb-mcp-example-")
    ledger = os.path.join(work, "ledger.txt")
    params = StdioServerParameters(
        command=GATEWAY,
        args=["serve", "--store", os.path.join(work, "agent.idem"), "--tenant", "demo", "--",
              sys.executable, os.path.join(HERE, "tool_server.py"), ledger],
    )
    rng = random.Random(3)
    plan = ["disk 91% on db-1", "p99 latency up on checkout", "cert expires in 3 days"]
    calls = 0
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        for step, summary in enumerate(plan, start=1):
            answers = set()
            for words in fake_model_calls(step, summary, rng):
                result = await session.call_tool(
                    "open_ticket", {"summary": words}, read_timeout_seconds=10.0,
                    meta={"io.idemdb/task": "incident-triage-1", "io.idemdb/step": step},
                )
                calls += 1
                answers.add(result.content[0].text)
                replayed = result.meta.get("io.idemdb/replayed", False)
                print(f"step {step}: {words!r:45} -> {result.content[0].text}"
                      f"{'  (replayed)' if replayed else ''}")
            assert len(answers) == 1, answers
    with open(ledger) as f:
        effects = f.read().splitlines()
    duplicates = len(effects) - len(plan)
    print(f"\n{calls} tool calls for {len(plan)} steps: {len(effects)} side effects, "
          f"{duplicates} duplicate side effects")
    assert duplicates == 0


anyio.run(main)
