"""Times FastMCP's OpenAPI import of GitHub's REST API description, for comparison with
toolmux-rest's `import` benchmark (see BENCHMARKS-rest.md). Usage: fastmcp_import.py SPEC [RUNS]"""
import asyncio
import json
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import httpx  # noqa: E402
from fastmcp import FastMCP  # noqa: E402


async def count_tools(server) -> int:
    tools = await server.get_tools()
    return len(tools)


def main() -> None:
    spec_path = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with open(spec_path, encoding="utf-8") as f:
        text = f.read()
    parse_and_import, import_only, tools = [], [], 0
    for _ in range(runs):
        start = time.perf_counter()
        spec = json.loads(text)
        parsed = time.perf_counter()
        client = httpx.AsyncClient(base_url="http://127.0.0.1:9")
        server = FastMCP.from_openapi(openapi_spec=spec, client=client, name="github")
        done = time.perf_counter()
        parse_and_import.append(done - start)
        import_only.append(done - parsed)
        tools = asyncio.run(count_tools(server))
    print(json.dumps({
        "fastmcp_runs": runs,
        "fastmcp_tools": tools,
        "fastmcp_parse_and_import_ms_median": round(statistics.median(parse_and_import) * 1000, 1),
        "fastmcp_import_parsed_ms_median": round(statistics.median(import_only) * 1000, 1),
    }))


if __name__ == "__main__":
    main()
