//! An MCP server's `envFile` through the real binary: the server gets every line, and only
//! the lines that may be credentials are redacted in what toolmux shows.

use crate::{Project, peer};

/// Each line of an env file is judged as a value from the environment outside a
/// credential's place: a port, a level, a count, a host and a URL without credentials
/// read as they are in tool outputs (every line was a secret, so a `PORT=8080` made every
/// `8080` read `[redacted]`), while a short value under a secret-sounding name and a long
/// value under a plain one are still redacted, and the server gets them all.
#[test]
fn env_file_lines_are_secrets_only_when_they_may_be_credentials() {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new();
    project
        .file(
            "server.env",
            "# the server's settings\nPORT=8080\nLOG_LEVEL=debug\nCACHE_SECONDS=86400\n\
             UPSTREAM_HOST=db.internal.example\nexport API_URL=\"https://api.example.com/v1\"\n\
             FEATURE_ON=true\nAPI_TOKEN=ab12\nWEBHOOK_SIGNING=whsec-q8Zr2mK4vN\n",
        )
        .file(
            "toolmux.yaml",
            &format!(
                "mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n    \
                 envFile: server.env\n",
                node.display(),
                everything.display()
            ),
        );
    let message = "listening on 8080 at debug for 86400 s behind db.internal.example and \
                   https://api.example.com/v1 (true), token ab12, signing whsec-q8Zr2mK4vN";
    let arguments = serde_json::json!({ "message": message }).to_string();
    let run = project.run(&["tools", "call", "everything__echo", &arguments]);
    let echoed = run.ok().trim();
    assert_eq!(
        echoed,
        "Echo: listening on 8080 at debug for 86400 s behind db.internal.example and \
         https://api.example.com/v1 (true), token [redacted], signing [redacted]",
        "{}",
        run.stderr
    );

    // The server got every line, the credentials too (shown redacted, but there).
    let run = project.run(&["tools", "call", "everything__get-env"]);
    let env = run.ok();
    for (name, shown) in [
        ("PORT", "8080"),
        ("LOG_LEVEL", "debug"),
        ("CACHE_SECONDS", "86400"),
        ("UPSTREAM_HOST", "db.internal.example"),
        ("API_URL", "https://api.example.com/v1"),
        ("API_TOKEN", "[redacted]"),
        ("WEBHOOK_SIGNING", "[redacted]"),
    ] {
        let line = format!("\"{name}\": \"{shown}\"");
        assert!(env.contains(&line), "no {line} in {env}");
    }
    for secret in ["ab12", "q8Zr2mK4vN"] {
        assert!(!env.contains(secret) && !run.stderr.contains(secret), "{secret} leaked: {env}");
    }
}

/// The credentials of an env file are redacted in calls of other tools too: `tools call`
/// starts only the provider it calls, and the env files of the servers it left out (or
/// that are disabled) were never read, so a file or a command output holding a server's
/// token showed it.
#[test]
fn env_file_credentials_are_redacted_when_their_server_is_not_started() {
    let project = Project::new();
    project
        .file("remote.env", "PORT=8080\nREMOTE_API_TOKEN=zq-remote-7Hc2\n")
        .file("off.env", "OFF_PASSWORD=zq-off-9Lm4\n")
        .file("leak.txt", "port 8080, token zq-remote-7Hc2, password zq-off-9Lm4\n")
        .file(
            "toolmux.yaml",
            "fs: {permissions: [read, execute]}\nmcpServers:\n  remote:\n    command: /bin/false\n    envFile: remote.env\n  \
             off:\n    command: /bin/false\n    enabled: false\n    envFile: off.env\n  \
             gone:\n    command: /bin/false\n    enabled: false\n    envFile: missing.env\n",
        );
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"leak.txt"}"#]);
    assert_eq!(
        run.ok().trim(),
        "1\tport 8080, token [redacted], password [redacted]",
        "{}",
        run.stderr
    );
    let run = project.run(&["tools", "call", "fs__bash", r#"{"command":"cat leak.txt"}"#]);
    let out = run.ok();
    assert!(out.contains("token [redacted], password [redacted]"), "{out}");
    assert!(!out.contains("zq-") && !run.stderr.contains("zq-"), "{out}{}", run.stderr);
}
