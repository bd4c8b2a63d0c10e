// Per-call latency of the official TypeScript SDK client (@modelcontextprotocol/sdk, as
// installed by .ci/install-peers with server-everything) calling server-everything's `echo`
// directly over stdio, against the same client calling `everything__echo` through the real
// `toolmux serve --stdio`. The companion of benches/serve.rs (an rmcp client) for a client
// that people's agents and the MCP Inspector use; results in BENCHMARKS-serve.md.
//
// Run: node crates/toolmux-mcp/benches/serve_clients.mjs [CALLS] (after
// `cargo build --release -p toolmux-cli`; TOOLMUX_BIN overrides the binary).
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const modules = join(root, ".peers/node/node_modules");
const sdk = (path) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", path)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");

const calls = Number(process.argv[2] ?? 3000);
const everything = join(modules, "@modelcontextprotocol/server-everything/dist/index.js");
const toolmux = process.env.TOOLMUX_BIN ?? join(root, "target/release/toolmux");
const dir = mkdtempSync(join(tmpdir(), "toolmux-serve-clients-"));
const config = join(dir, "toolmux.json");
writeFileSync(config, JSON.stringify({
  mcpServers: { everything: { command: process.execPath, args: [everything, "stdio"] } },
}));

async function connect(command, args) {
  const transport = new StdioClientTransport({ command, args, cwd: dir, stderr: "ignore" });
  const client = new Client({ name: "toolmux-bench", version: "1" });
  await client.connect(transport);
  return client;
}

async function measure(client, tool, n) {
  const args = { name: tool, arguments: { message: "hello" } };
  for (let i = 0; i < 100; i++) await client.callTool(args);
  const times = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    const result = await client.callTool(args);
    times.push(Number(process.hrtime.bigint() - start) / 1000);
    if (result.isError) throw new Error(`echo failed: ${JSON.stringify(result)}`);
  }
  times.sort((a, b) => a - b);
  const at = (q) => times[Math.min(times.length - 1, Math.floor(times.length * q))];
  return [at(0.5), at(0.9), at(0.99)];
}

const paths = [
  { label: "TypeScript SDK client → server-everything (stdio)", tool: "echo",
    client: await connect(process.execPath, [everything, "stdio"]), runs: [] },
  { label: "TypeScript SDK client → `toolmux serve --stdio` → server-everything", tool: "everything__echo",
    client: await connect(toolmux, ["--config", config, "serve", "--stdio"]), runs: [] },
];
for (let run = 0; run < 3; run++) {
  for (const path of paths) path.runs.push(await measure(path.client, path.tool, calls));
}
console.log("| path | calls | median µs | p90 µs | p99 µs |\n|---|---|--:|--:|--:|");
const best = paths.map((path) => path.runs.reduce((a, b) => (b[0] < a[0] ? b : a)));
paths.forEach((path, i) => {
  const [p50, p90, p99] = best[i].map((v) => v.toFixed(0));
  console.log(`| ${path.label} | ${calls} | ${p50} | ${p90} | ${p99} |`);
});
console.log(`\nratio of medians, toolmux / direct: ${(best[1][0] / best[0][0]).toFixed(2)} (best median of 3 runs each)`);
for (const path of paths) await path.client.close();
