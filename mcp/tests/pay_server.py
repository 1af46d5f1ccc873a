"""A payment tool server that deduplicates by the key the gateway forwards, as a payment API
does with an `Idempotency-Key` (official Python SDK, stdio).

`charge` records each attempt, and charges once per `_meta["io.idemdb/key"]`: an attempt under
a key already charged answers that charge. The first charge ever (no `died` file yet in DIR)
has its side effect, then the server dies before it answers. `balance` is marked
`readOnlyHint: true`; `receipts` is not marked. Both answer with the key they were given.

    python pay_server.py DIR
"""

import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

DIR = sys.argv[1]
CHARGES = os.path.join(DIR, "charges.txt")
ATTEMPTS = os.path.join(DIR, "attempts.txt")
app = MCPServer("pay")


def key_of(ctx):
    return (ctx.request_context.meta or {}).get("io.idemdb/key")


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


@app.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
def charge(amount: int, ctx: Context) -> str:
    key = key_of(ctx)
    with open(ATTEMPTS, "a") as f:
        f.write(f"{key}\t{amount}\n")
    for line in lines(CHARGES):
        charged_key, _, charge_id = line.split("\t")
        if key is not None and charged_key == key:
            return charge_id
    charge_id = f"ch_{len(lines(CHARGES)) + 1}"
    with open(CHARGES, "a") as f:
        f.write(f"{key}\t{amount}\t{charge_id}\n")
    died = os.path.join(DIR, "died")
    if not os.path.exists(died):
        open(died, "w").close()
        os._exit(1)
    return charge_id


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def balance(ctx: Context) -> str:
    return f"balance 100; key {key_of(ctx)}"


@app.tool()
def receipts(ctx: Context) -> str:
    return f"no receipts; key {key_of(ctx)}"


if __name__ == "__main__":
    app.run()
