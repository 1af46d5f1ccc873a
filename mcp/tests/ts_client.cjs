// The gateway driven by the official TypeScript SDK's client (@modelcontextprotocol/sdk, from
// npm): a keyed call to the ledger server, then a retry of the same step with reworded
// arguments in a new session (a new gateway process on the same store), which replays the
// first result; the ledger holds one side effect.
//
//   node ts_client.cjs NODE_MODULES GATEWAY_BINARY PYTHON STORE_DIR

const path = require("path");
const fs = require("fs");

const [nodeModules, gateway, python, storeDir] = process.argv.slice(2);
const sdk = (p) => require(path.join(nodeModules, "@modelcontextprotocol/sdk/dist/cjs", p));
const { Client } = sdk("client/index.js");
const { StdioClientTransport } = sdk("client/stdio.js");

const ledger = path.join(storeDir, "ledger.txt");
const transport = () =>
  new StdioClientTransport({
    command: gateway,
    args: ["serve", "--store", path.join(storeDir, "gateway.idem"), "--tenant", "agent-ts", "--",
      python, path.join(__dirname, "ledger_server.py"), ledger],
  });

async function call(title) {
  const client = new Client({ name: "ts-agent", version: "1.0.0" });
  await client.connect(transport());
  try {
    return await client.callTool(
      { name: "create_incident", arguments: { title },
        _meta: { "io.idemdb/task": "ts-task", "io.idemdb/step": 7 } },
      undefined,
      { timeout: 10000 },
    );
  } finally {
    await client.close();
  }
}

(async () => {
  const first = await call("API down");
  const retry = await call("The API is down");
  const text = (r) => r.content[0].text;
  if (text(first) !== text(retry)) throw new Error(`${text(first)} != ${text(retry)}`);
  if (first._meta["io.idemdb/key"] !== "tc1:ts-task:7:create_incident") throw new Error(JSON.stringify(first._meta));
  if (retry._meta["io.idemdb/replayed"] !== true || retry._meta["io.idemdb/argumentsChanged"] !== true)
    throw new Error(JSON.stringify(retry._meta));
  const lines = fs.readFileSync(ledger, "utf8").trim().split("\n");
  if (lines.length !== 1) throw new Error(`ledger: ${lines}`);
  console.log(`typescript client: the retry replayed "${text(retry)}"; ${lines.length} side effect in the ledger`);
})().catch((e) => { console.error(e); process.exit(1); });
