//! Checks of settings that fit their types but not each other or what they name, made at
//! load so that `config check` refuses them with the line of the value at fault, where they
//! were found only as the providers started (a `type: stdio` server with only a `url`
//! passed `config check` and then failed the run), or without a line.
//!
//! Each file is checked on its own: only what no other layer can mend is checked here (a
//! queue a server names may be defined in another layer's file, so that stays with the
//! assembly of the merged settings).

use super::{Config, FileFormat, Source, value_position};
use crate::ToolmuxError;

/// The first setting of `config`, read from `source`, that cannot work.
pub(super) fn check(config: &Config, source: &Source<'_>) -> Result<(), ToolmuxError> {
    #[cfg(feature = "mcp")]
    servers(config, source)?;
    queues(config, source)?;
    permissions(config, source)
}

/// Line and column of the value at `path` in the file (`mcpServers.s.url`), else of the
/// nearest key above it that is found.
fn position(source: &Source<'_>, path: &str) -> Option<(usize, usize)> {
    let mut path = path;
    loop {
        let found = match source.format {
            FileFormat::Toml => super::super::toml::position(source.text, path),
            FileFormat::Json | FileFormat::Yaml => value_position(source.text, path),
        };
        if found.is_some() {
            return found;
        }
        path = path.rsplit_once('.')?.0;
    }
}

/// The section servers are written under in the file: VS Code's `servers`, or
/// `mcpServers`.
#[cfg(feature = "mcp")]
fn servers_section(source: &Source<'_>) -> &'static str {
    let vscode = match source.format {
        FileFormat::Toml => super::super::toml::position(source.text, "servers").is_some(),
        FileFormat::Json | FileFormat::Yaml => value_position(source.text, "servers").is_some(),
    };
    if vscode && position(source, "mcpServers") != position(source, "servers") {
        "servers"
    } else {
        "mcpServers"
    }
}

/// A server's transport against what it is given: a stdio server needs a `command`, a
/// remote one a `url` of its transport's schemes.
#[cfg(feature = "mcp")]
fn servers(config: &Config, source: &Source<'_>) -> Result<(), ToolmuxError> {
    use toolmux_mcp::TransportKind;
    let section = servers_section(source);
    for (name, entry) in &config.mcp_servers {
        if entry.enabled == Some(false) || entry.disabled == Some(true) {
            continue;
        }
        let at = format!("{section}.{name}");
        let fail = |key: &str, message: String| {
            let path = format!("{at}.{key}");
            Err(source.error(position(source, &path), format!("{path}: {message}")))
        };
        let transport = entry.transport.or(match (&entry.command, &entry.url) {
            (Some(_), _) => Some(TransportKind::Stdio),
            (None, Some(url)) if starts_with_ignoring_case(url, &["ws://", "wss://"]) => {
                Some(TransportKind::Websocket)
            }
            (None, Some(_)) => Some(TransportKind::Http),
            (None, None) => None,
        });
        let Some(transport) = transport else {
            return fail(
                "command",
                "neither `command` nor `url` is set: give `command` (a program toolmux starts) \
                 or `url` (a server it connects to), or `enabled: false` to keep the entry \
                 unused"
                    .to_owned(),
            );
        };
        match (transport, &entry.command, &entry.url) {
            (TransportKind::Stdio, None, Some(_)) => {
                return fail(
                    "type",
                    "`type: stdio` needs `command`, the program to start, and this server has \
                     only `url`: for a server toolmux connects to write `type: http` (or `sse`, \
                     `websocket`), or leave `type` out"
                        .to_owned(),
                );
            }
            (TransportKind::Stdio, None, None) => {
                return fail(
                    "command",
                    "`type: stdio` needs `command`, the program to start".to_owned(),
                );
            }
            (remote, Some(_), None) if remote != TransportKind::Stdio => {
                return fail(
                    "type",
                    format!(
                        "`type: {}` needs `url`, the server's address, and this server has \
                         only `command`: for a program toolmux starts write `type: stdio`, or \
                         leave `type` out",
                        remote.as_str()
                    ),
                );
            }
            (remote, _, None) if remote != TransportKind::Stdio => {
                return fail(
                    "url",
                    format!("`type: {}` needs `url`, the server's address", remote.as_str()),
                );
            }
            (remote, _, Some(url)) if remote != TransportKind::Stdio => {
                if let Some(message) = bad_url(remote, url) {
                    return fail("url", message);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// What is wrong with a remote server's `url` for its transport, if anything; never the
/// URL itself, which may carry a secret from the environment.
#[cfg(feature = "mcp")]
fn bad_url(transport: toolmux_mcp::TransportKind, url: &str) -> Option<String> {
    let schemes: &[&str] = match transport {
        toolmux_mcp::TransportKind::Websocket => &["ws", "wss"],
        _ => &["http", "https"],
    };
    let wanted = schemes.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(" or ");
    let Some((scheme, _)) = url.split_once("://") else {
        return Some(format!(
            "must start with {wanted}, as in {}://127.0.0.1:8080/mcp",
            schemes[0]
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    if schemes.contains(&scheme.as_str()) {
        return None;
    }
    // Shown only when it is a scheme people write: what comes before the first `://` of a
    // value from the environment may be anything (`host/mcp?token=...&cb=http`).
    const SHOWN: [&str; 12] =
        ["http", "https", "ws", "wss", "sse", "file", "unix", "tcp", "grpc", "ftp", "ssh", "git"];
    Some(match SHOWN.contains(&scheme.as_str()) {
        true => format!(
            "has the scheme `{scheme}`; the {} transport takes {wanted}",
            transport.as_str()
        ),
        false => format!(
            "does not start with a scheme the {} transport takes: it takes {wanted}",
            transport.as_str()
        ),
    })
}

/// Whether `text` starts with one of `prefixes`, whatever the case of its letters
/// (`WSS://` is a WebSocket URL too).
pub(crate) fn starts_with_ignoring_case(text: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|prefix| {
        text.get(..prefix.len()).is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    })
}

/// A queue has at least one slot.
fn queues(config: &Config, source: &Source<'_>) -> Result<(), ToolmuxError> {
    match config.queues.iter().find(|(_, queue)| queue.concurrent == 0) {
        Some((name, _)) => {
            let path = format!("queues.{name}.concurrent");
            Err(source.error(
                position(source, &path),
                format!("{path}: `concurrent: 0` lets no call run; give at least 1 slot"),
            ))
        }
        None => Ok(()),
    }
}

/// Each permission rule is one the orchestrator can read.
fn permissions(config: &Config, source: &Source<'_>) -> Result<(), ToolmuxError> {
    let p = &config.permissions;
    for (list, rules) in [("allow", &p.allow), ("deny", &p.deny), ("ask", &p.ask)] {
        for rule in rules {
            let one = toolmux_orchestrator::PermissionRules::default();
            let one = match list {
                "allow" => one.allow(rule),
                "deny" => one.deny(rule),
                _ => one.ask(rule),
            };
            if let Err(message) = one.check() {
                let path = format!("permissions.{list}");
                let position =
                    rule_position(source, &path, rule).or_else(|| position(source, &path));
                return Err(source.error(position, message));
            }
        }
    }
    Ok(())
}

/// Line and column of `rule` written in the list at `path`, when it is written as it is.
fn rule_position(source: &Source<'_>, path: &str, rule: &str) -> Option<(usize, usize)> {
    let (line, column) = position(source, path)?;
    let from: usize = source.text.split_inclusive('\n').take(line - 1).map(str::len).sum();
    let from =
        from + source.text[from..].chars().take(column - 1).map(char::len_utf8).sum::<usize>();
    let at = from + source.text[from..].find(rule)?;
    Some(super::super::toml::line_column(source.text, at))
}
