"""A stdio MCP server (JSON lines by hand, no SDK) for the CLI tests, shaped by its one
argument, a JSON object:

- `name`: the server's name;
- `tools`: its tools, as `tools/list` gives them;
- `text`: what every call answers;
- `write` (optional): a file every call writes `changed` to, in the working folder;
- `notify` (optional): the method of a notification sent before every call's answer;
- `sleep` (optional): seconds every call takes before its answer, calls answered on
  threads of their own, so that several run at once.

Usage: python line_server.py '{"name": "n", "tools": [...], "text": "done"}'
"""

import json
import sys
import threading
import time

SPEC = json.loads(sys.argv[1])
LOCK = threading.Lock()


def send(message):
    with LOCK:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def answer_late(id, result):
    time.sleep(SPEC["sleep"])
    send({"jsonrpc": "2.0", "id": id, "result": result})


for line in sys.stdin:
    request = json.loads(line)
    method, id = request.get("method"), request.get("id")
    if id is None:
        continue
    if method == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": SPEC["name"], "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": SPEC["tools"]}
    elif method == "tools/call":
        if "write" in SPEC:
            with open(SPEC["write"], "w") as f:
                f.write("changed")
        if "notify" in SPEC:
            send({"jsonrpc": "2.0", "method": SPEC["notify"]})
        result = {"content": [{"type": "text", "text": SPEC["text"]}]}
        if "sleep" in SPEC:
            threading.Thread(target=answer_late, args=(id, result), daemon=True).start()
            continue
    else:
        result = {}
    send({"jsonrpc": "2.0", "id": id, "result": result})
