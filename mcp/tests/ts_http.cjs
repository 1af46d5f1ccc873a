// The gateway on Streamable HTTP (`idemdb-mcp serve --listen`) driven by the official
// TypeScript SDK's client over StreamableHTTPClientTransport: a keyed call to the ledger server,
// then a retry of the same step with reworded arguments in a new session, which replays the
// first result (`_meta` says `io.idemdb/replayed`); the ledger holds one side effect.
//
//   node ts_http.cjs NODE_MODULES GATEWAY_BINARY PYTHON STORE_DIR

const path = require("path");
const fs = require("fs");
const { spawn } = require("child_process");

const [nodeModules, gateway, python, storeDir] = process.argv.slice(2);
const sdk = (p) => require(path.join(nodeModules, "@modelcontextprotocol/sdk/dist/cjs", p));
const { Client } = sdk("client/index.js");
const { StreamableHTTPClientTransport } = sdk("client/streamableHttp.js");

const ledger = path.join(storeDir, "ledger.txt");

// Starts the gateway on a free port; resolves with its URL, from the line it prints once
// listening.
function startGateway() {
  const proc = spawn(gateway, ["serve", "--listen", "127.0.0.1:0", "--store",
    path.join(storeDir, "gateway.idem"), "--", python, path.join(__dirname, "ledger_server.py"), ledger],
    { stdio: ["ignore", "inherit", "pipe"] });
  return new Promise((resolve, reject) => {
    let seen = "";
    proc.stderr.on("data", (chunk) => {
      seen += chunk;
      const found = seen.match(/listening on (http:\/\/\S+\/mcp)/);
      if (found) resolve({ proc, url: found[1] });
    });
    proc.on("exit", (code) => reject(new Error(`the gateway exited (${code}): ${seen}`)));
  });
}

async function call(url, title) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { "x-idemdb-tenant": "agent-ts" } },
  });
  const client = new Client({ name: "ts-agent", version: "1.0.0" });
  await client.connect(transport);
  try {
    return await client.callTool(
      { name: "create_incident", arguments: { title },
        _meta: { "io.idemdb/task": "ts-http", "io.idemdb/step": 3 } },
      undefined,
      { timeout: 10000 },
    );
  } finally {
    await transport.terminateSession();
    await client.close();
  }
}

(async () => {
  const { proc, url } = await startGateway();
  try {
    const first = await call(url, "API down");
    const retry = await call(url, "The API is down");
    const text = (r) => r.content[0].text;
    if (text(first) !== text(retry)) throw new Error(`${text(first)} != ${text(retry)}`);
    if (first._meta["io.idemdb/key"] !== "tc1:ts-http:3:create_incident") throw new Error(JSON.stringify(first._meta));
    if (first._meta["io.idemdb/replayed"] !== undefined) throw new Error(JSON.stringify(first._meta));
    if (retry._meta["io.idemdb/replayed"] !== true || retry._meta["io.idemdb/argumentsChanged"] !== true)
      throw new Error(JSON.stringify(retry._meta));
    const lines = fs.readFileSync(ledger, "utf8").trim().split("\n");
    if (lines.length !== 1) throw new Error(`ledger: ${lines}`);
    console.log(`typescript http client: the retry in a new session replayed "${text(retry)}"; ${lines.length} side effect in the ledger`);
  } finally {
    proc.removeAllListeners("exit");
    proc.kill("SIGKILL");
  }
})().catch((e) => { console.error(e); process.exit(1); });
