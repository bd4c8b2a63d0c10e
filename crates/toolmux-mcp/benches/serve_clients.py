# Per-call latency of the official Python SDK client (PyPI `mcp`, as installed by
# .ci/install-peers) calling server-everything's `echo` directly over stdio, against the
# same client calling `everything__echo` through the real `toolmux serve --stdio`; the
# companion of benches/serve.rs (an rmcp client) and benches/serve_clients.mjs (the
# TypeScript SDK client) for the client the tests drive. Results in
# BENCHMARKS-serve.md.
#
# Run: .peers/python/venv/bin/python crates/toolmux-mcp/benches/serve_clients.py [CALLS]
# (after `cargo build --release -p toolmux-cli`; TOOLMUX_BIN overrides the binary,
# TOOLMUX_BIN_B adds a second build, SERVE_BENCH_BIN the byte and JSON relays of
# benches/serve.rs). Paths take turns in 50-call rounds, as in the other two.
import json
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[3]
MODULES = ROOT / ".peers/node/node_modules"
EVERYTHING = MODULES / "@modelcontextprotocol/server-everything/dist/index.js"
ROUND = 50


def at(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


async def measure(client, tool, n):
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        result = await client.call_tool(tool, {"message": "hello"})
        times.append((time.perf_counter_ns() - start) / 1000)
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result}")
    return times


async def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    node = "node"
    toolmux = os.environ.get("TOOLMUX_BIN", str(ROOT / "target/release/toolmux"))
    work = tempfile.mkdtemp(prefix="toolmux-serve-py-")
    config = Path(work) / "toolmux.json"
    config.write_text(
        json.dumps({"mcpServers": {"everything": {"command": node, "args": [str(EVERYTHING), "stdio"]}}})
    )
    serve = ["--config", str(config), "serve", "--stdio"]
    paths = [
        ("direct", "Python SDK client → server-everything (stdio)", "echo", node, [str(EVERYTHING), "stdio"]),
        ("binary", "Python SDK client → `toolmux serve --stdio` → server-everything", "everything__echo", toolmux, serve),
    ]
    if os.environ.get("TOOLMUX_BIN_B"):
        paths.append(("binary-b", "the same through the `TOOLMUX_BIN_B` build", "everything__echo",
                      os.environ["TOOLMUX_BIN_B"], serve))
    if os.environ.get("SERVE_BENCH_BIN"):
        bench = os.environ["SERVE_BENCH_BIN"]
        paths.append(("relay", "Python SDK client → byte relay → server-everything", "echo", bench, ["--relay"]))
        paths.append(("json-threads", "Python SDK client → JSON relay (two threads) → server-everything", "echo",
                      bench, ["--json-relay", "threads", "0", "0"]))
    async with AsyncExitStack() as stack:
        clients = []
        for key, label, tool, command, args in paths:
            params = StdioServerParameters(command=command, args=args, cwd=work)
            client = await stack.enter_async_context(Client(params, mode="legacy"))
            clients.append({"key": key, "label": label, "tool": tool, "client": client, "samples": [], "rounds": []})
        for path in clients:
            await measure(path["client"], path["tool"], 100)
        rounds = max(1, -(-calls * 3 // ROUND))
        for _ in range(rounds):
            for path in clients:
                times = await measure(path["client"], path["tool"], ROUND)
                path["samples"].extend(times)
                path["rounds"].append(at(times, 0.5))
    print("| path | calls | median µs | p90 µs | p99 µs |\n|---|---|--:|--:|--:|")
    for path in clients:
        s = path["samples"]
        print(f"| {path['label']} | {len(s)} | {at(s, 0.5):.0f} | {at(s, 0.9):.0f} | {at(s, 0.99):.0f} |")
    direct = clients[0]
    for path in clients[1:]:
        ratios = [m / d for m, d in zip(path["rounds"], direct["rounds"])]
        medians = at(path["samples"], 0.5) / at(direct["samples"], 0.5)
        print(
            f"ratio {path['key']} / direct: {medians:.2f} of the medians of all calls; "
            f"{at(ratios, 0.5):.2f} the median of {len(ratios)} same-round ratios "
            f"(quartiles {at(ratios, 0.25):.2f}–{at(ratios, 0.75):.2f})"
        )


anyio.run(main)
