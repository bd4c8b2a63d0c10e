//! `${VAR}`, `${VAR:-default}` and `${env:VAR}` in string values, expanded from the
//! environment after parsing; every value taken from the environment is remembered as a
//! secret.
//!
//! Other `${...}` forms are left as they are: `${parameters.x}` belongs to REST templates,
//! `${input:x}` to VS Code. `${workspaceFolder}` and `${userHome}` (VS Code) are filled in,
//! and so are `${CLAUDE_PROJECT_DIR}` and `${TOOLMUX_PROJECT_DIR}` (the project's folder,
//! as a command hook's environment has them), wherever they stand: a hook command pasted
//! from Claude Code (`${CLAUDE_PROJECT_DIR}/.claude/hooks/x.sh`) and a server's `args`
//! alike.

use serde_json::Value;

/// Looks an environment variable up: the process environment in the binary, a map in
/// tests.
pub(crate) type Lookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// A variable that is not set and has no default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unset {
    /// The variable.
    pub(crate) variable: String,
    /// The JSON path of the key whose value names it (`mcpServers.github.env.TOKEN`).
    pub(crate) path: String,
}

/// What expansion found besides the new values.
#[derive(Debug, Default)]
pub(crate) struct Expansion {
    /// Values taken from the environment.
    pub(crate) secrets: Vec<String>,
    /// `${input:x}` references left as they are.
    pub(crate) inputs: Vec<String>,
}

/// Expands every string in `value` in place; every variable that is unset and has no
/// default, in the order met, when there is any.
pub(crate) fn expand(
    value: &mut Value,
    lookup: &Lookup<'_>,
    workspace: &str,
) -> Result<Expansion, Vec<Unset>> {
    let mut found = Expansion::default();
    let mut path = Vec::new();
    let mut unset = Vec::new();
    walk(value, lookup, workspace, &mut path, &mut found, &mut unset);
    if unset.is_empty() { Ok(found) } else { Err(unset) }
}

fn walk(
    value: &mut Value,
    lookup: &Lookup<'_>,
    workspace: &str,
    path: &mut Vec<String>,
    found: &mut Expansion,
    unset: &mut Vec<Unset>,
) {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                let mut missing = Vec::new();
                *text = expand_str(text, lookup, workspace, found, &mut missing);
                let at = path.join(".");
                unset.extend(
                    missing.into_iter().map(|variable| Unset { variable, path: at.clone() }),
                );
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let parent = path.pop().unwrap_or_default();
                path.push(format!("{parent}[{i}]"));
                walk(item, lookup, workspace, path, found, unset);
                path.pop();
                path.push(parent);
            }
        }
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                path.push(key.clone());
                walk(item, lookup, workspace, path, found, unset);
                path.pop();
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `text` with its references expanded; the variables unset without a default are added
/// to `unset` (their references left as they are). `$${` is a literal `${`, as in Docker
/// Compose: a shell's `${f}` in a hook command is written `$${f}`.
fn expand_str(
    text: &str,
    lookup: &Lookup<'_>,
    workspace: &str,
    found: &mut Expansion,
    unset: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            out.push_str(&rest[..start - 1]);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &after[..end];
        let whole = &rest[start..start + 2 + end + 1];
        match reference(inner) {
            Reference::Env { name, default } => match (lookup(name), default) {
                // `${VAR:-default}`: the default when VAR is unset or empty, as in a shell.
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => {
                    if !is_public(name, &v) {
                        found.secrets.push(v.clone());
                    }
                    out.push_str(&v);
                }
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    unset.push(name.to_owned());
                    out.push_str(whole);
                }
            },
            Reference::Workspace => out.push_str(workspace),
            Reference::Home => match lookup("HOME") {
                Some(home) => out.push_str(&home),
                None => {
                    unset.push("HOME".to_owned());
                    out.push_str(whole);
                }
            },
            Reference::Input => {
                found.inputs.push(whole.to_owned());
                out.push_str(whole);
            }
            Reference::Other => out.push_str(whole),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

enum Reference<'a> {
    Env { name: &'a str, default: Option<&'a str> },
    Workspace,
    Home,
    Input,
    Other,
}

fn reference(inner: &str) -> Reference<'_> {
    if let Some(name) = inner.strip_prefix("env:") {
        return if is_name(name) {
            Reference::Env { name, default: None }
        } else {
            Reference::Other
        };
    }
    match inner {
        "workspaceFolder" => return Reference::Workspace,
        "userHome" => return Reference::Home,
        // The folder command hooks run in, which their environment names so too.
        "CLAUDE_PROJECT_DIR" | "TOOLMUX_PROJECT_DIR" => return Reference::Workspace,
        _ => {}
    }
    if inner.starts_with("input:") {
        return Reference::Input;
    }
    let (name, default) = match inner.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (inner, None),
    };
    if is_name(name) { Reference::Env { name, default } } else { Reference::Other }
}

/// Variables that describe the machine or name a place rather than hold credentials.
/// Redacting their values (a home folder, a user name, a region such as `us`) would mangle
/// ordinary paths and words in every output: `${API_USER}` = `user` made `user-agent` read
/// `[redacted]-agent`.
///
/// Besides the machine's own (`HOME`, `USER`, `XDG_*`…), a name whose last word says what
/// it names (`*_USER`, `*_HOST`, `*_PORT`, `*_REGION`, `*_ORG`…) is public unless another
/// of its words sounds secret (`*TOKEN*`, `*KEY*`, `*PASS*`, `*SECRET*`…); `*_URL` and
/// `*_ENDPOINT` are when their value carries no user, password or query.
fn is_public(name: &str, value: &str) -> bool {
    const MACHINE: [&str; 9] =
        ["HOME", "USER", "LOGNAME", "PWD", "PATH", "SHELL", "TMPDIR", "LANG", "TERM"];
    const NAMES_A_PLACE: [&str; 24] = [
        "USER",
        "USERNAME",
        "LOGIN",
        "HOST",
        "HOSTNAME",
        "DOMAIN",
        "PORT",
        "REGION",
        "ZONE",
        "ORG",
        "ORGANIZATION",
        "OWNER",
        "REPO",
        "PROJECT",
        "ENV",
        "ENVIRONMENT",
        "STAGE",
        "VERSION",
        "DIR",
        "PATH",
        "LOCALE",
        "TZ",
        "TIMEZONE",
        "NAMESPACE",
    ];
    const SOUNDS_SECRET: [&str; 10] = [
        "TOKEN",
        "SECRET",
        "PASS",
        "PWD",
        "KEY",
        "AUTH",
        "CREDENTIAL",
        "COOKIE",
        "SESSION",
        "PRIVATE",
    ];
    if MACHINE.contains(&name) || name.starts_with("XDG_") || name.starts_with("LC_") {
        return true;
    }
    let upper = name.to_ascii_uppercase();
    if SOUNDS_SECRET.iter().any(|word| upper.contains(word)) {
        return false;
    }
    let last = upper.rsplit('_').next().unwrap_or_default();
    if NAMES_A_PLACE.contains(&last) {
        return true;
    }
    // A URL without credentials in it: `https://api.example.com/v1`.
    matches!(last, "URL" | "ENDPOINT")
        && value.split_once("://").is_some_and(|(_, rest)| {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            !authority.contains('@') && !rest.contains('?')
        })
}

/// An environment variable name: a letter or `_`, then letters, digits, `_`.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret-token".into()),
            "HOME" => Some("/home/u".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn check(mut value: Value, expected: expect_test::Expect) {
        let shown = match expand(&mut value, &env, "/ws") {
            Ok(found) => {
                format!("{value}\nsecrets: {:?}\ninputs: {:?}", found.secrets, found.inputs)
            }
            Err(unset) => unset
                .iter()
                .map(|u| format!("unset {} at {}", u.variable, u.path))
                .collect::<Vec<_>>()
                .join("; "),
        };
        expected.assert_eq(&shown);
    }

    #[test]
    fn names_that_say_what_they_name_are_not_secrets() {
        for (name, value) in [
            ("HOME", "/home/u"),
            ("XDG_DATA_HOME", "/d"),
            ("API_USER", "user"),
            ("AWS_REGION", "us-east-1"),
            ("GITHUB_ORG", "acme"),
            ("DB_PORT", "5432"),
            ("API_BASE_URL", "https://api.example.com/v1"),
        ] {
            assert!(is_public(name, value), "{name}");
        }
        for (name, value) in [
            ("API_TOKEN", "t0k3n-value"),
            ("DB_PWD", "hunter22"),
            ("SECRET_DIR", "/s"),
            ("KEY_PATH", "/k"),
            ("BUSER", "user"),
            ("DATABASE_URL", "postgres://u:p@h/db"),
            ("HOOK_URL", "https://h/x?sig=abc123"),
            ("TEAM", "acme"),
        ] {
            assert!(!is_public(name, value), "{name}");
        }
    }

    #[test]
    fn plain_and_default() {
        check(
            json!({"a": "Bearer ${TOKEN}", "b": "${MISSING:-fallback}", "c": "${TOKEN:-x}", "d": "${EMPTY}", "e": "${EMPTY:-when empty}"}),
            expect![[r#"
                {"a":"Bearer s3cret-token","b":"fallback","c":"s3cret-token","d":"","e":"when empty"}
                secrets: ["s3cret-token", "s3cret-token", ""]
                inputs: []"#]],
        );
    }

    #[test]
    fn vscode_forms() {
        check(
            json!({"servers": {"x": {"env": {"T": "${env:TOKEN}", "I": "${input:api-key}", "W": "${workspaceFolder}/a", "H": "${userHome}", "P": "${HOME}/bin"}}}}),
            expect![[r#"
                {"servers":{"x":{"env":{"H":"/home/u","I":"${input:api-key}","P":"/home/u/bin","T":"s3cret-token","W":"/ws/a"}}}}
                secrets: ["s3cret-token"]
                inputs: ["${input:api-key}"]"#]],
        );
    }

    #[test]
    fn templates_survive() {
        check(
            json!({"url": "https://x/${parameters.id}?q=${parameters.q}", "odd": "${", "unclosed": "a ${TOKEN", "hook": "${CLAUDE_PROJECT_DIR}/h.sh ${TOOLMUX_PROJECT_DIR}"}),
            expect![[r#"
                {"hook":"/ws/h.sh /ws","odd":"${","unclosed":"a ${TOKEN","url":"https://x/${parameters.id}?q=${parameters.q}"}
                secrets: []
                inputs: []"#]],
        );
    }

    #[test]
    fn unset_names_variable_and_path() {
        check(
            json!({"mcpServers": {"github": {"args": ["a", "${GITHUB_TOKEN}"]}}}),
            expect!["unset GITHUB_TOKEN at mcpServers.github.args[1]"],
        );
        check(json!({"x": "${env:NOPE}"}), expect!["unset NOPE at x"]);
        check(
            json!({"x": "${A} and ${B}", "y": ["${C}"]}),
            expect!["unset A at x; unset B at x; unset C at y[0]"],
        );
    }

    /// `$${` is a literal `${`: a shell's own variables in a hook command.
    #[test]
    fn a_doubled_dollar_is_literal() {
        check(
            json!({"command": "f=$(jq -r .path); echo \"read $${f}\" ${TOKEN} $$HOME"}),
            expect![[r#"
                {"command":"f=$(jq -r .path); echo \"read ${f}\" s3cret-token $$HOME"}
                secrets: ["s3cret-token"]
                inputs: []"#]],
        );
    }

    #[test]
    fn keys_are_not_expanded() {
        check(
            json!({"${TOKEN}": 1}),
            expect![[r#"
                {"${TOKEN}":1}
                secrets: []
                inputs: []"#]],
        );
    }
}
