#!/usr/bin/env bash
# Measures the import of GitHub's REST API description by FastMCP and by toolmux-rest in one
# run. FastMCP goes into its own virtualenv (.peers/python/bench-venv) so that it cannot
# change the versions of the test peers in .peers/python/venv.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
spec="$root/.peers/node/node_modules/@octokit/openapi/generated/api.github.com.json"
if [ ! -f "$spec" ]; then
  echo "missing test peer @octokit/openapi: run .ci/install-peers" >&2
  exit 1
fi
venv="$root/.peers/python/bench-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# 2.14.7 is the newest FastMCP whose dependencies resolve from the registry mirror here.
"$venv/bin/pip" install --quiet --disable-pip-version-check fastmcp==2.14.7
echo "== FastMCP 2.14.7 =="
"$venv/bin/python" "$root/crates/toolmux-rest/benches/fastmcp_import.py" "$spec" 5 2>/dev/null
echo "== toolmux-rest =="
cd "$root"
cargo bench -p toolmux-rest --bench import
