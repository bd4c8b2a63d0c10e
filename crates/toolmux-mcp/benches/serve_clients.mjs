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

// `n` calls in a row; the latency of each, in µs.
async function measure(client, tool, n) {
  const args = { name: tool, arguments: { message: "hello" } };
  const times = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    const result = await client.callTool(args);
    times.push(Number(process.hrtime.bigint() - start) / 1000);
    if (result.isError) throw new Error(`echo failed: ${JSON.stringify(result)}`);
  }
  return times;
}

const sorted = (values) => [...values].sort((a, b) => a - b);
const at = (values, q) => values[Math.min(values.length - 1, Math.floor(values.length * q))];

const paths = [
  { key: "direct", label: "TypeScript SDK client → server-everything (stdio)", tool: "echo",
    client: await connect(process.execPath, [everything, "stdio"]) },
  { key: "binary", label: "TypeScript SDK client → `toolmux serve --stdio` → server-everything", tool: "everything__echo",
    client: await connect(toolmux, ["--config", config, "serve", "--stdio"]) },
];
// TOOLMUX_BIN_B: a second build measured in the same run, for before/after pairs.
if (process.env.TOOLMUX_BIN_B) {
  paths.push({ key: "binary-b", label: "the same through the `TOOLMUX_BIN_B` build", tool: "everything__echo",
    client: await connect(process.env.TOOLMUX_BIN_B, ["--config", config, "serve", "--stdio"]) });
}
// SERVE_BENCH_BIN (the bench binary of benches/serve.rs, target/release/deps/serve-*): its
// byte relay and JSON relay in front of server-everything, the floors, in the same run.
if (process.env.SERVE_BENCH_BIN) {
  const bench = process.env.SERVE_BENCH_BIN;
  paths.push({ key: "relay", label: "TypeScript SDK client → byte relay → server-everything", tool: "echo",
    client: await connect(bench, ["--relay"]) });
  paths.push({ key: "json-threads", label: "TypeScript SDK client → JSON relay (two threads) → server-everything",
    tool: "echo", client: await connect(bench, ["--json-relay", "threads", "0", "0"]) });
}
// As benches/serve.rs does: the paths take turns in 50-call rounds, so that the machine's
// drift falls on all alike, and each round is compared with the direct path's next to it.
const ROUND = 50;
for (const path of paths) {
  await measure(path.client, path.tool, 100);
  path.samples = [];
  path.rounds = [];
}
const rounds = Math.max(1, Math.ceil((calls * 3) / ROUND));
for (let round = 0; round < rounds; round++) {
  for (const path of paths) {
    const times = await measure(path.client, path.tool, ROUND);
    path.samples.push(...times);
    path.rounds.push(at(sorted(times), 0.5));
  }
}
console.log("| path | calls | median µs | p90 µs | p99 µs |\n|---|---|--:|--:|--:|");
for (const path of paths) {
  const all = sorted(path.samples);
  const [p50, p90, p99] = [0.5, 0.9, 0.99].map((q) => at(all, q).toFixed(0));
  console.log(`| ${path.label} | ${all.length} | ${p50} | ${p90} | ${p99} |`);
}
const direct = paths[0];
for (const path of paths.slice(1)) {
  const ratios = sorted(path.rounds.map((m, i) => m / direct.rounds[i]));
  const medians = at(sorted(path.samples), 0.5) / at(sorted(direct.samples), 0.5);
  console.log(
    `ratio ${path.key} / direct: ${medians.toFixed(2)} of the medians of all calls; ` +
      `${at(ratios, 0.5).toFixed(2)} the median of ${ratios.length} same-round ratios ` +
      `(quartiles ${at(ratios, 0.25).toFixed(2)}–${at(ratios, 0.75).toFixed(2)})`,
  );
}
for (const path of paths) await path.client.close();
