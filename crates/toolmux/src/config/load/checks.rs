//! Checks of settings that fit their types but not each other or what they name, made at
//! load so that `config check` refuses them with the line of the value at fault, where they
//! were found only as the providers started (a `type: stdio` server with only a `url`
//! passed `config check` and then failed the run), or without a line.
//!
//! Each file is checked on its own: only what no other layer can mend is checked here. A
//! queue a server names may be defined in another layer's file, so [`undefined_queue`] runs
//! once the layers are merged, with the places [`queue_places`] noted in each file.

use super::{Config, FileFormat, Source, value_position};
use crate::ToolmuxError;
use toolmux_core::suggest::closest;

/// The first setting of `config`, read from `source`, that cannot work; `written`: the
/// settings as written, before `${VAR}` expansion.
pub(super) fn check(
    config: &Config,
    written: &serde_json::Value,
    source: &Source<'_>,
) -> Result<(), ToolmuxError> {
    #[cfg(feature = "mcp")]
    servers(config, written, source)?;
    #[cfg(not(feature = "mcp"))]
    let _ = written;
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
/// remote one a `url` of its transport's schemes that the MCP client can read.
#[cfg(feature = "mcp")]
fn servers(
    config: &Config,
    written: &serde_json::Value,
    source: &Source<'_>,
) -> Result<(), ToolmuxError> {
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
                    // A value from the environment may be a credential: the reference as
                    // written stands for it (`bad_url` repeats none of the value).
                    let reference = written
                        .get(section)
                        .and_then(|servers| servers.get(name))
                        .and_then(|entry| entry.get("url"))
                        .and_then(serde_json::Value::as_str)
                        .filter(|url| url.contains("${"));
                    return match reference {
                        Some(reference) => {
                            fail("url", format!("{reference:?} as expanded {message}"))
                        }
                        None => fail("url", message),
                    };
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// What is wrong with a remote server's `url` for its transport, if anything, as a
/// predicate (`has no host`); never any part of the URL but a scheme among the few people
/// write, as the URL may carry a secret from the environment. A reference (`${MCP_URL}`)
/// gets the same words: one of a dozen scheme names tells nothing of a secret, and is what
/// its author needs to know.
#[cfg(feature = "mcp")]
fn bad_url(transport: toolmux_mcp::TransportKind, url: &str) -> Option<String> {
    let schemes: &[&str] = match transport {
        toolmux_mcp::TransportKind::Websocket => &["ws", "wss"],
        _ => &["http", "https"],
    };
    let wanted = schemes.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(" or ");
    let example = format!("{}://127.0.0.1:8080/mcp", schemes[0]);
    // The URL parser drops spaces and control characters at either end, as the MCP client's
    // does.
    let url = url.trim_matches(|c: char| c <= ' ');
    let Some((scheme, _)) = url.split_once("://") else {
        return Some(format!("must start with {wanted}, as in {example}"));
    };
    let scheme = scheme.to_ascii_lowercase();
    if !schemes.contains(&scheme.as_str()) {
        // Shown only when it is a scheme people write: what comes before the first `://` of
        // a value from the environment may be anything (`host/mcp?token=...&cb=http`).
        const SHOWN: [&str; 12] = [
            "http", "https", "ws", "wss", "sse", "file", "unix", "tcp", "grpc", "ftp", "ssh", "git",
        ];
        return Some(match SHOWN.contains(&scheme.as_str()) {
            true => format!(
                "has the scheme `{scheme}`; the {} transport takes {wanted}",
                transport.as_str()
            ),
            false => format!(
                "does not start with a scheme the {} transport takes: it takes {wanted}",
                transport.as_str()
            ),
        });
    }
    // The parser would drop a tab or a line break inside and turn a space in the path into
    // `%20`, connecting to a URL nobody wrote; a space in the host it refuses, saying only
    // that a character is wrong.
    if url.contains(char::is_whitespace) {
        return Some(
            "holds a space, a tab or a line break, which no URL does: remove it, or write a \
             space in a path or query as %20"
                .to_owned(),
        );
    }
    let Err(error) = url::Url::parse(url) else { return None };
    use url::ParseError;
    Some(match error {
        ParseError::EmptyHost => {
            format!("has no host: name the server after {scheme}://, as in {example}")
        }
        ParseError::InvalidPort => format!(
            "has a port that is no number from 0 to 65535: write it after the host's `:`, as \
             in {example}"
        ),
        ParseError::InvalidDomainCharacter | ParseError::IdnaError => format!(
            "has a host that no server can have (a character such as `<`, `>`, `%`, `^` or \
             `|` in its name): name the server after {scheme}://, as in {example}"
        ),
        ParseError::InvalidIpv4Address => format!(
            "has a host that reads as an IPv4 address and is none (four numbers from 0 to \
             255): as in {example}"
        ),
        ParseError::InvalidIpv6Address => format!(
            "has a host that reads as an IPv6 address and is none: write one in brackets, as \
             in {scheme}://[::1]:8080/mcp"
        ),
        _ => format!("is not a URL the client can read: give one such as {example}"),
    })
}

/// Whether `text` starts with one of `prefixes`, whatever the case of its letters
/// (`WSS://` is a WebSocket URL too).
#[cfg(feature = "mcp")]
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

/// Where a setting that names a queue (`mcpServers.a.queue: fast`) is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::config) struct QueuePlace {
    /// 1-based line and column of its value, when found.
    pub(in crate::config) position: Option<(usize, usize)>,
    /// The value as written when it holds a `${VAR}` reference, shown in its place.
    pub(in crate::config) reference: Option<String>,
}

/// Where each setting of a file names a queue, by the entry that holds it
/// (`mcpServers.a`, `tools.fs__grep`): an entry is a layer's whole, so the file that set
/// the entry set its queue.
pub(in crate::config) type QueuePlaces = std::collections::BTreeMap<String, QueuePlace>;

/// The entries of `config` that name a queue: section, entry and queue. A server that is
/// not started is left out, as its settings never reach the orchestrator.
fn queue_uses(config: &Config) -> Vec<(&'static str, &str, &str)> {
    let mut uses = Vec::new();
    #[cfg(feature = "mcp")]
    for (name, entry) in &config.mcp_servers {
        if entry.enabled != Some(false)
            && entry.disabled != Some(true)
            && let Some(queue) = &entry.queue
        {
            uses.push(("mcpServers", name.as_str(), queue.as_str()));
        }
    }
    for (name, entry) in &config.tools {
        if let Some(queue) = &entry.queue {
            uses.push(("tools", name.as_str(), queue.as_str()));
        }
    }
    #[cfg(feature = "rest")]
    {
        for (name, tool) in &config.rest_tools {
            if let Some(queue) = &tool.queue {
                uses.push(("restTools", name.as_str(), queue.as_str()));
            }
        }
        for (name, import) in &config.openapi {
            if let Some(queue) = &import.queue {
                uses.push(("openapi", name.as_str(), queue.as_str()));
            }
        }
    }
    uses
}

/// Where every setting of `config`, read from `source`, names a queue; `written`: the
/// settings as written, before `${VAR}` expansion.
pub(super) fn queue_places(
    config: &Config,
    written: &serde_json::Value,
    source: &Source<'_>,
) -> QueuePlaces {
    let mut places = QueuePlaces::new();
    for (section, name, _) in queue_uses(config) {
        // VS Code's files name the servers' section `servers`.
        let sections: &[&str] =
            if section == "mcpServers" { &["mcpServers", "servers"] } else { &[section] };
        let Some((at, entry)) =
            sections.iter().find_map(|at| Some((*at, written.get(*at)?.get(name)?)))
        else {
            continue;
        };
        let reference = entry
            .get("queue")
            .and_then(serde_json::Value::as_str)
            .filter(|queue| queue.contains("${"))
            .map(str::to_owned);
        let position = position(source, &format!("{at}.{name}.queue"));
        places.insert(format!("{section}.{name}"), QueuePlace { position, reference });
    }
    places
}

/// Every queue a setting of `config` names is defined under `queues`, in whichever layer:
/// else the error names the file that set the entry and the line of its `queue`, which
/// `place` finds by section and entry (`"mcpServers"`, `"a"`), and the closest defined
/// queue. The orchestrator refused it too, but only as the tools were assembled, without a
/// line.
pub(in crate::config) fn undefined_queue(
    config: &Config,
    place: &dyn Fn(&str, &str) -> (String, QueuePlace),
) -> Result<(), ToolmuxError> {
    let defined: Vec<&str> = config.queues.keys().map(String::as_str).collect();
    let Some((section, name, queue)) =
        queue_uses(config).into_iter().find(|(_, _, queue)| !config.queues.contains_key(*queue))
    else {
        return Ok(());
    };
    let (file, QueuePlace { position, reference }) = place(section, name);
    // A name from the environment is shown as its reference, as every value from there.
    let named = match &reference {
        Some(reference) => format!("{reference:?} as expanded names no queue"),
        None => format!("queue `{queue}` is not"),
    };
    let hint = match (&reference, closest(queue, &defined)) {
        (None, Some(best)) => format!("; did you mean `{best}`?"),
        _ if defined.is_empty() => format!(
            "; no queue is defined: add one under `queues`, as in `queues: {{{}: {{concurrent: 4}}}}`",
            reference.as_ref().map_or(queue, |_| "NAME")
        ),
        _ => format!("; the queues defined are {}", defined.join(", ")),
    };
    Err(ToolmuxError::Config {
        file,
        line: position.map(|p| p.0),
        column: position.map(|p| p.1),
        message: super::words::printable(&format!(
            "{section}.{name}.queue: {named} defined under `queues`{hint}"
        ))
        .into_owned(),
    })
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
