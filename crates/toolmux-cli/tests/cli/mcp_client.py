# Drives `toolmux serve` with the official Python MCP SDK client (PyPI `mcp`): lists every
# tool (all pages), calls one tool of each provider and a failing one, and prints one JSON
# summary line that the Rust test asserts on.
#
# usage: python mcp_client.py stdio CMD ARGS...
#        python mcp_client.py http URL
import json
import sys

import anyio
from mcp import Client, StdioServerParameters


async def main() -> None:
    transport, target = sys.argv[1], sys.argv[2:]
    if transport == "stdio":
        server = StdioServerParameters(command=target[0], args=target[1:])
    else:
        server = target[0]
    out: dict = {"transport": transport}
    with anyio.fail_after(90):
        async with Client(server, mode="legacy") as client:
            out["protocol"] = client.session.protocol_version
            names: list[str] = []
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                names.extend(t.name for t in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            out["tools"] = sorted(names)
            calls = {
                "fs__grep": {"pattern": "TODO"},
                "everything__echo": {"message": "hi"},
                "fs__read": {"path": "../outside.txt"},
                "everything__get-annotated-message": {"messageType": "error", "includeImage": True},
                # server-everything runs this one only as a task; toolmux calls it as one.
                "everything__simulate-research-query": {"topic": "gateway"},
            }
            for name, arguments in calls.items():
                if name not in names:
                    continue
                result = await client.call_tool(name, arguments)
                out[name] = {
                    "is_error": bool(result.is_error),
                    "text": getattr(result.content[0], "text", "") if result.content else "",
                    "annotations": [
                        c.annotations.model_dump(mode="json", exclude_none=True)
                        if getattr(c, "annotations", None)
                        else None
                        for c in result.content
                    ],
                    "extras": (result.meta or {}).get("toolmux/extras"),
                }
    print(json.dumps(out, sort_keys=True))


anyio.run(main)
