//! What a person is told when a server does not start: a stdio server that exits at once
//! says its last words on stderr and the command to run by hand, and `serve --http` on a
//! port in use names the address and what to choose instead.

use crate::Project;
use std::os::unix::fs::PermissionsExt as _;

/// A project whose one MCP server is a script that prints a usage error to stderr (and the
/// token its `env` gives it) and exits 2 before it speaks.
fn project_with_failing_server() -> Project {
    let project = Project::new();
    project
        .file(
            "bad-server.sh",
            "#!/bin/sh\necho \"usage: bad-server --root DIR (token $TOKEN)\" >&2\n\
             echo 'error: missing --root' >&2\nexit 2\n",
        )
        .file(
            "toolmux.yaml",
            "mcpServers:\n  bad:\n    command: ./bad-server.sh\n    args: [--verbose, two words]\n    \
             env:\n      TOKEN: tok-9f8e7d6c5b\n",
        );
    let script = project.path().join("bad-server.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    project
}

/// `text` tells the server's stderr and the command line to run by hand, without its
/// `env` value.
fn assert_tells_why(text: &str, project: &Project) {
    assert!(text.contains("exit status: 2"), "{text}");
    assert!(
        text.contains("usage: bad-server --root DIR (token [redacted]) | error: missing --root"),
        "{text}"
    );
    let hint = format!(
        "to see why, run `./bad-server.sh --verbose 'two words'` by hand in {} (with its `env` \
         set: TOKEN)",
        project.path().display()
    );
    assert!(text.contains(&hint), "{text}");
    assert!(!text.contains("tok-9f8e7d6c5b"), "the env value is a secret: {text}");
}

#[test]
fn tools_list_tells_what_a_server_that_exits_at_once_said() {
    let project = project_with_failing_server();
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("provider `bad` failed to start"), "{}", run.stderr);
    assert_tells_why(&run.stderr, &project);
}

#[test]
fn config_check_tells_what_a_server_that_exits_at_once_said() {
    let project = project_with_failing_server();
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 3, "{run:?}");
    let line = run.stdout.lines().find(|l| l.contains("FAILED")).unwrap_or_default();
    assert!(line.trim_start().starts_with("bad "), "{run:?}");
    assert_tells_why(line, &project);
}

#[test]
fn a_server_that_exits_without_a_word_says_so_and_how_to_run_it() {
    let project = Project::new();
    project.file("toolmux.yaml", "mcpServers:\n  quiet:\n    command: \"false\"\n");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 3, "{run:?}");
    let hint = format!(
        "(server process exit status: 1; it wrote nothing on stderr; to see why, run `false` by \
         hand in {})",
        project.path().display()
    );
    assert!(run.stderr.contains(&hint), "{}", run.stderr);
}

#[test]
fn serve_http_on_a_port_in_use_names_the_address_and_what_to_choose() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = taken.local_addr().expect("its address");
    let project = Project::new();
    let run = project.run(&["serve", "--http", &addr.to_string()]);
    assert_eq!(run.code, 4, "{run:?}");
    let port = addr.port();
    assert_eq!(
        run.stderr.trim_end(),
        format!(
            "error: cannot listen on 127.0.0.1:{port}: another program is using port {port}; \
             choose another port, or 127.0.0.1:0 for any free one"
        )
    );
}

/// With `-v` at a terminal, the log's fields show the control characters of what a server
/// wrote as escapes, as every other line does: the `error=` of "mcp server failed to
/// start" quoting the server's stderr carried OSC 52 (the clipboard), `ESC[2J` and a lone
/// CR to the terminal as they came, and the `stderr:` line of `-vv` its lone CR. The
/// formatter's own colours stay; a pipe gets the bytes.
#[test]
fn log_fields_at_a_terminal_show_control_characters_as_escapes() {
    let project = Project::new();
    project
        .file(
            "bad-server.sh",
            "#!/bin/sh\nprintf 'boom \\033]52;c;aGk=\\007 clear\\033[2J cr\\rover\\n' >&2\nexit 3\n",
        )
        .file("toolmux.yaml", "mcpServers:\n  bad:\n    command: ./bad-server.sh\n");
    let script = project.path().join("bad-server.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let escaped = r"boom \x1b]52;c;aGk=\x07 clear\x1b[2J cr\x0dover";
    let run = project.run_at_terminal(&serde_json::json!([]), &["-vv", "tools", "list"]);
    assert_eq!(run.code, 3, "{run:?}");
    let warned = run
        .stdout
        .lines()
        .find(|line| line.contains("mcp server failed to start"))
        .unwrap_or_else(|| panic!("no log line of the failed start: {run:?}"));
    assert!(warned.contains(escaped), "{warned:?}");
    let logged = run.stdout.lines().find(|line| line.contains("stderr: boom"));
    let logged = logged.unwrap_or_else(|| panic!("no log line of the server's stderr: {run:?}"));
    assert!(logged.contains(escaped), "{logged:?}");
    // Every escape sequence left is a colour of the formatter's (SGR: ESC [ digits m), and
    // every CR is the terminal's before a line feed.
    let text = run.stdout.as_str();
    for (at, _) in text.match_indices('\x1b') {
        let sequence = &text[at + 1..];
        let end = sequence.find('m').unwrap_or(0);
        let colour = sequence.starts_with('[')
            && end > 0
            && sequence[1..end].chars().all(|c| c.is_ascii_digit() || c == ';');
        assert!(
            colour,
            "a raw escape sequence at {at}: {:?}",
            &text[at..(at + 20).min(text.len())]
        );
    }
    for (at, _) in text.match_indices('\r') {
        assert!(
            text[at + 1..].starts_with('\n'),
            "a lone CR at {at}: {:?}",
            &text[at.saturating_sub(20)..]
        );
    }
    assert!(!text.contains('\x07'), "a raw BEL: {text:?}");

    let piped = project.run(&["-v", "tools", "list"]);
    assert_eq!(piped.code, 3, "{piped:?}");
    let warned = piped.stderr.lines().find(|line| line.contains("mcp server failed to start"));
    let warned = warned.unwrap_or_else(|| panic!("no log line of the failed start: {piped:?}"));
    assert!(warned.contains("boom \x1b]52;c;aGk=\x07 clear\x1b[2J cr\rover"), "{warned:?}");
}
