//! `${VAR}` and the shell's forms `${VAR:-default}`, `${VAR-default}`, `${VAR:+alt}`,
//! `${VAR+alt}`, `${VAR:?message}` and `${VAR?message}`, and `${env:VAR}`, in string values,
//! expanded from the environment after parsing; the values taken from the environment that
//! may be credentials are remembered as secrets (see [`is_secret`]).
//!
//! A default may hold references of its own (`${A:-${B:-/tmp}}`), and a `${` that nothing
//! closes is an error (`$${` is a literal `${`). So is a reference that is none of these
//! but looks meant as one: `${}`, `${1BAD}`, `${VAR%x}` (an operator toolmux does not
//! take), which were left as text that no program would have understood.
//!
//! Other `${...}` forms are left as they are: `${parameters.x}` belongs to REST templates,
//! `${input:x}` to VS Code. VS Code's `${workspaceFolder}`, `${workspaceFolderBasename}`,
//! `${userHome}`, `${pathSeparator}` and `${/}` are filled in, and its variables about the
//! editor (`${file}`, `${cwd}`…) are refused when no such variable is set; so are
//! `${CLAUDE_PROJECT_DIR}` and `${TOOLMUX_PROJECT_DIR}` filled in (the project's folder, as
//! a command hook's environment has them), wherever they stand: a hook command pasted
//! from Claude Code (`${CLAUDE_PROJECT_DIR}/.claude/hooks/x.sh`) and a server's `args`
//! alike.

use serde_json::Value;
use toolmux_core::credential;

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

/// Why the strings of a configuration could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExpandError {
    /// A `${` with no `}` to close it, in the string at this JSON path. Left as it was,
    /// `root: ${PROJECT_ROOT` would have been taken as a folder of that name.
    Unterminated {
        /// The JSON path of the key whose value holds it.
        path: String,
    },
    /// Variables unset without a default, in the order met.
    Unset(Vec<Unset>),
    /// A `${...}` that looks meant as a variable's but is none toolmux reads.
    Malformed {
        /// The JSON path of the key whose value holds it.
        path: String,
        /// The reference as written (`${1BAD}`).
        reference: String,
        /// What is wrong with it and how to write it.
        why: String,
    },
    /// `${VAR:?message}` (or `${VAR?message}`) with `VAR` unset (or empty).
    Required {
        /// The JSON path of the key whose value holds it.
        path: String,
        /// The variable.
        variable: String,
        /// The message written after `?`; may be empty.
        message: String,
    },
}

/// What expansion found besides the new values.
#[derive(Debug, Default)]
pub(crate) struct Expansion {
    /// Values taken from the environment that may be credentials ([`is_secret`]).
    pub(crate) secrets: Vec<String>,
    /// `${input:x}` references left as they are.
    pub(crate) inputs: Vec<String>,
    /// References only a shell reads (`${1}`, `${VAR%.txt}`, `${#}`), left as they are for
    /// the program the value reaches (`sh -c '...'`): each is `` `${1}` in KEY ``.
    pub(crate) shell: Vec<String>,
}

/// Expands every string in `value` in place. The first string with an unterminated `${`, a
/// malformed reference or a `${VAR:?message}` whose variable is missing is an error; else
/// every variable that is unset and has no default, in the order met, when there is any.
pub(crate) fn expand(
    value: &mut Value,
    lookup: &Lookup<'_>,
    workspace: &str,
) -> Result<Expansion, ExpandError> {
    let mut found = Expansion::default();
    let mut path = Vec::new();
    let mut problems = Problems::default();
    walk(value, lookup, workspace, &mut path, false, &mut found, &mut problems);
    if let Some(stop) = problems.stop {
        return Err(stop);
    }
    if problems.unset.is_empty() { Ok(found) } else { Err(ExpandError::Unset(problems.unset)) }
}

/// What was wrong in the strings walked so far.
#[derive(Debug, Default)]
struct Problems {
    /// The first string's problem that stops expansion: an unterminated `${`, a malformed
    /// reference, a required variable missing.
    stop: Option<ExpandError>,
    unset: Vec<Unset>,
}

/// Expands the strings of `value`, at `path`; `after_secret_flag`: `value` is an item of a
/// list whose item before it is a flag that says a credential follows (`--token`).
fn walk(
    value: &mut Value,
    lookup: &Lookup<'_>,
    workspace: &str,
    path: &mut Vec<String>,
    after_secret_flag: bool,
    found: &mut Expansion,
    problems: &mut Problems,
) {
    match value {
        Value::String(text) => {
            if text.contains("${") {
                let mut missing = Vec::new();
                let place = Place { secret: after_secret_flag || is_secret_place(path) };
                let at = path.join(".");
                let shell_before = found.shell.len();
                let expanded = expand_str(text, lookup, workspace, place, found, &mut missing);
                for reference in &mut found.shell[shell_before..] {
                    *reference = format!("`{reference}` in {at}");
                }
                match expanded {
                    Ok(expanded) => *text = expanded,
                    Err(stop) if problems.stop.is_none() => {
                        problems.stop = Some(stop.at(at.clone()));
                    }
                    Err(_) => {}
                }
                problems.unset.extend(
                    missing.into_iter().map(|variable| Unset { variable, path: at.clone() }),
                );
            }
        }
        Value::Array(items) => {
            for i in 0..items.len() {
                let after_flag = i > 0 && items[i - 1].as_str().is_some_and(is_secret_lead);
                let parent = path.pop().unwrap_or_default();
                path.push(format!("{parent}[{i}]"));
                walk(&mut items[i], lookup, workspace, path, after_flag, found, problems);
                path.pop();
                path.push(parent);
            }
        }
        Value::Object(map) => {
            let servers =
                matches!(path.as_slice(), [section] if SERVER_SECTIONS.contains(&section.as_str()));
            for (key, item) in map.iter_mut() {
                path.push(key.clone());
                if servers {
                    walk_server(item, lookup, workspace, path, found, problems);
                } else {
                    walk(item, lookup, workspace, path, false, found, problems);
                }
                path.pop();
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The top-level keys whose entries are MCP servers with an `env` of their own: toolmux's
/// and Claude Desktop's, Cursor's and Gemini CLI's `mcpServers`, VS Code's `servers`, Zed's
/// `context_servers`, Codex's `mcp_servers`.
const SERVER_SECTIONS: [&str; 4] = ["mcpServers", "servers", "context_servers", "mcp_servers"];

/// The keys of a server entry whose `${VAR}` may name a variable of the entry's own `env`.
const SERVER_SCOPED: [&str; 4] = ["command", "args", "cwd", "path"];

/// Expands the strings of MCP server entry `entry`, at `path`, as [`walk`] does, except
/// that in its `command`, `args` and `cwd` a `${VAR}` whose `VAR` is a key of the entry's
/// own `env` takes that entry's value (itself expanded first) rather than the process's:
/// the apps whose files these are pass `args` on as written, and the program reads them
/// from the environment the entry gives it. mcp-remote documents exactly this form
/// (`"--header", "Authorization:${AUTH_HEADER}"` with `"env": {"AUTH_HEADER": "Bearer
/// ..."}`). Zed's older `command: {path, args, env}` is an entry of its own within.
fn walk_server(
    entry: &mut Value,
    lookup: &Lookup<'_>,
    workspace: &str,
    path: &mut Vec<String>,
    found: &mut Expansion,
    problems: &mut Problems,
) {
    let Value::Object(map) = entry else {
        return walk(entry, lookup, workspace, path, false, found, problems);
    };
    // The entry's `env` expanded on the side, so that every key is then walked in the
    // file's order: what is found and reported (warnings, the first error, the unset
    // variables) comes in that order as elsewhere.
    let mut own = std::collections::BTreeMap::new();
    if let Some(Value::Object(env)) = map.get("env") {
        let (mut aside, mut ignored) = (Expansion::default(), Problems::default());
        for (name, value) in env {
            let mut value = value.clone();
            walk(&mut value, lookup, workspace, path, false, &mut aside, &mut ignored);
            let value = match value {
                Value::String(text) => text,
                Value::Number(_) | Value::Bool(_) => value.to_string(),
                Value::Null | Value::Array(_) | Value::Object(_) => continue,
            };
            own.insert(name.clone(), value);
        }
    }
    let scoped = |name: &str| own.get(name).cloned().or_else(|| lookup(name));
    for (key, item) in map.iter_mut() {
        path.push(key.clone());
        let lookup: &Lookup<'_> =
            if SERVER_SCOPED.contains(&key.as_str()) { &scoped } else { lookup };
        if key == "command" && item.is_object() {
            walk_server(item, lookup, workspace, path, found, problems);
        } else {
            walk(item, lookup, workspace, path, false, found, problems);
        }
        path.pop();
    }
}

/// Why a string's expansion stopped.
enum Stop {
    /// A `${` that nothing closes.
    Unterminated,
    /// A reference toolmux does not read: the reference, what is wrong with it.
    Malformed(String, String),
    /// `${VAR:?message}` with `VAR` missing: the variable, the message.
    Required(String, String),
}

impl Stop {
    /// The error for the string at `path`.
    fn at(self, path: String) -> ExpandError {
        match self {
            Stop::Unterminated => ExpandError::Unterminated { path },
            Stop::Malformed(reference, why) => ExpandError::Malformed { path, reference, why },
            Stop::Required(variable, message) => ExpandError::Required { path, variable, message },
        }
    }
}

/// Where in the configuration a string stands, as far as secrets go.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// The string is one that carries credentials: a header, an environment entry, or a
    /// value under a key that names a credential (`token`, `apiKey`, `auth`…), or right
    /// after a flag that does (`--token`).
    secret: bool,
}

/// One `${VAR}` expanded into a string: the variable, its value, and where the value
/// stands in the expanded string (byte offsets).
struct Expanded<'a> {
    name: &'a str,
    /// The variables whose defaults it stands in, outermost first: in
    /// `${API_KEY:-${FALLBACK}}` the value of `FALLBACK` is used as `API_KEY`.
    instead_of: Vec<&'a str>,
    value: String,
    start: usize,
    end: usize,
}

/// `text` with its references expanded, or why it cannot be (a `${` with no `}` to close
/// it, a malformed reference, a required variable missing); the
/// variables unset without a default are added to `unset` (their references left as they
/// are). `$${` is a literal `${`, as in Docker Compose: a shell's `${f}` in a hook
/// command is written `$${f}`. A default may hold references of its own
/// (`${A:-${B:-/tmp}}`), expanded only when it is used, as in a shell.
///
/// The values taken from the environment that [`is_secret`] finds secret where they stand
/// are added to `found`.
fn expand_str(
    text: &str,
    lookup: &Lookup<'_>,
    workspace: &str,
    place: Place,
    found: &mut Expansion,
    unset: &mut Vec<String>,
) -> Result<String, Stop> {
    let mut out = Output { text: String::with_capacity(text.len()), expanded: Vec::new() };
    let scope = Scope { lookup, workspace, instead_of: Vec::new() };
    expand_into(text, &scope, &mut out, found, unset)?;
    let Output { text: out, expanded } = out;
    for e in expanded {
        let secret_place = place.secret || is_secret_part(&out, e.start, e.end);
        // A machine's variable is never a secret, in whatever's place; another value is
        // judged by its own name and by the name of each variable it stands in for.
        let secret = !is_machine(e.name)
            && std::iter::once(e.name)
                .chain(e.instead_of.iter().copied())
                .any(|name| is_secret(name, &e.value, secret_place));
        if secret {
            found.secrets.push(e.value);
        }
    }
    Ok(out)
}

/// The string being expanded and the values of variables in it.
struct Output<'a> {
    text: String,
    expanded: Vec<Expanded<'a>>,
}

/// What references are expanded with.
struct Scope<'s, 'a> {
    lookup: &'s Lookup<'s>,
    workspace: &'s str,
    /// The variables whose default is being expanded, outermost first.
    instead_of: Vec<&'a str>,
}

/// Appends `text` to `out` with its references expanded ([`expand_str`]), or says why it
/// cannot.
fn expand_into<'a>(
    text: &'a str,
    scope: &Scope<'_, 'a>,
    out: &mut Output<'a>,
    found: &mut Expansion,
    unset: &mut Vec<String>,
) -> Result<(), Stop> {
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            out.text.push_str(&rest[..start - 1]);
            out.text.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.text.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = closing_brace(after).ok_or(Stop::Unterminated)?;
        let inner = &after[..end];
        let whole = &rest[start..start + 2 + end + 1];
        match reference(inner) {
            Reference::Env { name, operator } => {
                let value = (scope.lookup)(name);
                expand_variable(name, value, operator, whole, scope, out, found, unset)?;
            }
            Reference::Workspace => out.text.push_str(scope.workspace),
            Reference::WorkspaceName => out.text.push_str(
                std::path::Path::new(scope.workspace)
                    .file_name()
                    .map(|name| name.to_string_lossy())
                    .unwrap_or_default()
                    .as_ref(),
            ),
            Reference::PathSeparator => out.text.push_str(std::path::MAIN_SEPARATOR_STR),
            Reference::Home => match (scope.lookup)("HOME") {
                Some(home) => out.text.push_str(&home),
                None => {
                    unset.push("HOME".to_owned());
                    out.text.push_str(whole);
                }
            },
            Reference::Editor(name) => match (scope.lookup)(name) {
                // A variable of that name is the user's own: it is read as any other.
                Some(value) => {
                    expand_variable(name, Some(value), None, whole, scope, out, found, unset)?;
                }
                None => {
                    return Err(Stop::Malformed(
                        whole.to_owned(),
                        "is one of VS Code's variables about the editor (its open file, its \
                         folders), which toolmux has no editor to fill in: write the path, or \
                         use `${workspaceFolder}` (the project's folder)"
                            .to_owned(),
                    ));
                }
            },
            Reference::Input => {
                found.inputs.push(whole.to_owned());
                out.text.push_str(whole);
            }
            Reference::Malformed(why) => return Err(Stop::Malformed(whole.to_owned(), why)),
            Reference::Shell => {
                found.shell.push(whole.to_owned());
                out.text.push_str(whole);
            }
            Reference::Other => out.text.push_str(whole),
        }
        rest = &after[end + 1..];
    }
    out.text.push_str(rest);
    Ok(())
}

/// Appends variable `name`'s expansion to `out`: its `value` (`None` when unset), or what
/// `operator` says instead, as a POSIX shell does; `whole` is the reference as written.
#[allow(clippy::too_many_arguments)]
fn expand_variable<'a>(
    name: &'a str,
    value: Option<String>,
    operator: Option<(Operator, &'a str)>,
    whole: &'a str,
    scope: &Scope<'_, 'a>,
    out: &mut Output<'a>,
    found: &mut Expansion,
    unset: &mut Vec<String>,
) -> Result<(), Stop> {
    // With a `:` the operator takes an empty value for an unset one, as in a shell.
    let value = match operator {
        Some((operator, _)) if operator.colon => value.filter(|v| !v.is_empty()),
        _ => value,
    };
    match (value, operator) {
        (Some(_), Some((Operator { kind: OperatorKind::Alternative, .. }, alternative))) => {
            expand_nested(alternative, name, scope, out, found, unset)
        }
        (None, Some((Operator { kind: OperatorKind::Alternative, .. }, _))) => Ok(()),
        (None, Some((Operator { kind: OperatorKind::Default, .. }, default))) => {
            expand_nested(default, name, scope, out, found, unset)
        }
        (None, Some((Operator { kind: OperatorKind::Required, .. }, message))) => {
            Err(Stop::Required(name.to_owned(), message.to_owned()))
        }
        (Some(v), _) => {
            let start = out.text.len();
            out.text.push_str(&v);
            let instead_of = scope.instead_of.clone();
            out.expanded.push(Expanded { name, instead_of, value: v, start, end: out.text.len() });
            Ok(())
        }
        (None, None) => {
            unset.push(name.to_owned());
            out.text.push_str(whole);
            Ok(())
        }
    }
}

/// How deep references may nest in defaults and alternatives (`${A:-${B:-${C}}}` is 3).
const MAX_NESTING: usize = 32;

/// Expands `text` (a default or an alternative), used in place of variable `name`.
fn expand_nested<'a>(
    text: &'a str,
    name: &'a str,
    scope: &Scope<'_, 'a>,
    out: &mut Output<'a>,
    found: &mut Expansion,
    unset: &mut Vec<String>,
) -> Result<(), Stop> {
    // Each level is a recursion and a scan of the rest of the text: a file nesting
    // thousands deep would take quadratic time and then overflow the stack.
    if scope.instead_of.len() >= MAX_NESTING {
        return Err(Stop::Malformed(
            format!("${{{name}"),
            format!(
                "nests references more than {MAX_NESTING} deep in defaults and \
                 alternatives (`${{A:-${{B:-...}}}}`); write fewer levels"
            ),
        ));
    }
    let mut instead_of = scope.instead_of.clone();
    instead_of.push(name);
    let inner = Scope { lookup: scope.lookup, workspace: scope.workspace, instead_of };
    expand_into(text, &inner, out, found, unset)
}

/// The offset in `after` (the text after a `${`) of the `}` that closes it, counting the
/// `${` met on the way as opened within it: `${A:-${B}}` closes at its last brace.
fn closing_brace(after: &str) -> Option<usize> {
    let bytes = after.as_bytes();
    let mut depth = 1usize;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"${") {
            depth += 1;
            i += 2;
            continue;
        }
        if bytes[i] == b'}' {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
        i += 1;
    }
    None
}

/// A shell operator after a variable's name: `:-`, `-`, `:+`, `+`, `:?`, `?`.
#[derive(Debug, Clone, Copy)]
struct Operator {
    kind: OperatorKind,
    /// Written with a `:`: an empty value counts as unset.
    colon: bool,
}

#[derive(Debug, Clone, Copy)]
enum OperatorKind {
    /// `-`: the text after it when the variable is unset.
    Default,
    /// `+`: the text after it when the variable is set, else nothing.
    Alternative,
    /// `?`: an error saying the text after it when the variable is unset.
    Required,
}

enum Reference<'a> {
    Env {
        name: &'a str,
        operator: Option<(Operator, &'a str)>,
    },
    Workspace,
    /// VS Code's `${workspaceFolderBasename}`.
    WorkspaceName,
    /// VS Code's `${pathSeparator}` and `${/}`.
    PathSeparator,
    Home,
    /// One of VS Code's variables about the editor, which toolmux cannot fill in.
    Editor(&'a str),
    Input,
    /// What is wrong with it, and how to write it.
    Malformed(String),
    /// A reference only a shell reads: a positional or special parameter (`${1}`, `${#}`)
    /// or an operator toolmux does not take (`${VAR%.txt}`, `${VAR:=x}`), kept as text for
    /// the shell the value may reach (a server's `sh -c` argument, a hook's command).
    Shell,
    Other,
}

/// VS Code's predefined variables that name what the editor has open, or where it runs.
const EDITOR_VARIABLES: [&str; 16] = [
    "cwd",
    "file",
    "fileWorkspaceFolder",
    "fileWorkspaceFolderBasename",
    "relativeFile",
    "relativeFileDirname",
    "fileBasename",
    "fileBasenameNoExtension",
    "fileExtname",
    "fileDirname",
    "fileDirnameBasename",
    "lineNumber",
    "columnNumber",
    "selectedText",
    "execPath",
    "defaultBuildTask",
];

/// How to write a literal `${` in the file, for the messages about references.
const LITERAL: &str = "a literal `${` is written `$${`";

fn reference(inner: &str) -> Reference<'_> {
    if let Some(name) = inner.strip_prefix("env:") {
        return if is_name(name) {
            Reference::Env { name, operator: None }
        } else {
            Reference::Other
        };
    }
    match inner {
        "workspaceFolder" => return Reference::Workspace,
        "workspaceFolderBasename" => return Reference::WorkspaceName,
        "pathSeparator" | "/" => return Reference::PathSeparator,
        "userHome" => return Reference::Home,
        // The folder command hooks run in, which their environment names so too.
        "CLAUDE_PROJECT_DIR" | "TOOLMUX_PROJECT_DIR" => return Reference::Workspace,
        name if EDITOR_VARIABLES.contains(&name) => return Reference::Editor(name),
        _ => {}
    }
    if inner.starts_with("input:") {
        return Reference::Input;
    }
    let name_end =
        inner.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(inner.len());
    let (name, rest) = inner.split_at(name_end);
    if name.is_empty() {
        // `${.x}` or `${ x}` is no variable's and nothing a shell reads either: a template's.
        return match rest.chars().next() {
            None => Reference::Malformed(format!(
                "is empty: name a variable (`${{VAR}}`), or {LITERAL}"
            )),
            // The shell's special parameters and their lengths: `${#}`, `${@}`, `${*}`,
            // `${!}`, `${-}`, `${?}`, `${#VAR}`, `${!VAR}`.
            Some(c) if "#@*!-?".contains(c) => Reference::Shell,
            Some(c) if c.is_whitespace() || "+=:%".contains(c) => Reference::Malformed(format!(
                "names no variable: write `${{VAR}}` or `${{VAR:-default}}`, or {LITERAL}"
            )),
            Some(_) => Reference::Other,
        };
    }
    let operator = |rest: &str| -> Option<(Operator, usize)> {
        let (colon, after) = match rest.strip_prefix(':') {
            Some(after) => (true, after),
            None => (false, rest),
        };
        let kind = match after.chars().next()? {
            '-' => OperatorKind::Default,
            '+' => OperatorKind::Alternative,
            '?' => OperatorKind::Required,
            _ => return None,
        };
        Some((Operator { kind, colon }, usize::from(colon) + 1))
    };
    // The shell's other operators (`${VAR:=x}`, `${VAR%x}`, `${VAR#x}`, `${VAR/a/b}`,
    // `${VAR^^}`, `${VAR:1:2}` and the like) change the value or set the variable:
    // toolmux takes none of them, and keeps them for a shell.
    let shell_operator = |rest: &str| match rest.strip_prefix(':') {
        Some(after) => after.chars().next().is_none_or(|c| "=0123456789 ".contains(c)),
        None => rest.starts_with(['=', '%', '#', '/', '^', ',', '@', '*']),
    };
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return Reference::Malformed(format!(
                "is not a variable's name (a name starts with a letter or `_`), or {LITERAL}"
            ));
        }
        // A shell's positional parameter (`${1}`, `${1%.txt}`, `${10:-x}`); `${1.x}` is
        // a template's.
        return match rest.is_empty() || operator(rest).is_some() || shell_operator(rest) {
            true => Reference::Shell,
            false => Reference::Other,
        };
    }
    if rest.is_empty() {
        return Reference::Env { name, operator: None };
    }
    if let Some((operator, len)) = operator(rest) {
        return Reference::Env { name, operator: Some((operator, &rest[len..])) };
    }
    match shell_operator(rest) {
        true => Reference::Shell,
        false => Reference::Other,
    }
}

/// Whether the value of `${name}`, expanded where `secret_place` says (a string or a part
/// of one that carries credentials), is to be redacted wherever text leaves toolmux.
///
/// Redacting every expanded value mangled ordinary output: `${LISTEN}` = `8080`,
/// `${MODE}` = `prod` or `${DATA}` = `/srv/data` made every tool output, error and log
/// line holding that text read `[redacted]`. So, in this order:
/// - a variable whose name has a word that names a credential ([`sounds_secret`]:
///   `TOKEN`, `KEY`, `SECRET`, `PASSWORD`, `AUTH`, `APIKEY`… as whole words, so
///   `GITHUB_TOKEN` and `apiKey` but not `MONKEY` or `TOKENIZER_PATH`) is a secret,
///   however short, unless its value is a number and its name says it is a count or a
///   limit (`MAX_TOKENS` = `4096`);
/// - a variable whose name says it names the machine or a place ([`is_public`]: `HOME`,
///   `*_PORT`, `*_REGION`…) is not;
/// - any other value is a secret where it carries credentials: in a header, an `env`
///   entry, under a key naming a credential, after a flag or word naming one (`--token`,
///   `api_key=`, `Bearer`), or in a URL's user, password, query or fragment;
/// - elsewhere a number, a boolean or the path of a file or folder that exists is not,
///   and another value is when it has 8 characters or more (shorter ones, elsewhere,
///   are words such as `prod` or `true` rather than credentials).
///
/// The [`toolmux_orchestrator::Redactor`] ignores values under 4 characters anyway.
fn is_secret(name: &str, value: &str, secret_place: bool) -> bool {
    if is_machine(name) {
        return false;
    }
    if sounds_secret(name) {
        return !(is_number(value) && names_a_count(name));
    }
    if is_public(name, value) {
        return false;
    }
    if secret_place {
        return true;
    }
    !is_plain(value) && value.chars().count() >= 8
}

/// Whether the line `name=value` of an MCP server's `envFile` is to be redacted: as the
/// value of `${name}` outside a credential's place ([`is_secret`]), so by its name first,
/// then by its length and kind. An env file is a server's whole environment written out,
/// settings (`PORT=8080`, `LOG_LEVEL=debug`) beside credentials, where an `env` entry
/// filled from `${VAR}` is a value the user chose to keep out of the file: a credential's
/// place.
#[cfg(feature = "mcp")]
pub(crate) fn is_secret_setting(name: &str, value: &str) -> bool {
    is_secret(name, value, false)
}

/// Whether the value of variable `name` that reaches a program's environment without a
/// `${VAR}` of the file (a literal `env` entry, a variable of `envPassthrough`) is to be
/// redacted: when the name sounds secret, as the value of `${name}` would be ([`is_secret`]),
/// so not a count (`MAX_TOKENS: 4096`) nor one of the machine's own. The
/// [`toolmux_orchestrator::Redactor`] leaves values under 4 characters alone.
#[cfg(feature = "mcp")]
pub(crate) fn is_secret_by_name(name: &str, value: &str) -> bool {
    let count = is_number(value) && names_a_count(name);
    !is_machine(name) && sounds_secret(name) && !count && !value.is_empty()
}

/// A name with a word that sounds like a credential: `GITHUB_TOKEN`, `OPENAI_API_KEY`,
/// `apiKey`, `X-Api-Key`, `PGPASSWORD`, judged by its words
/// ([`toolmux_core::credential::is_credential_name`], as the MCP client judges what a
/// stdio server inherits), never its text: `BYPASS`, `MONKEY`, `KEYBOARD_LAYOUT`,
/// `PASSAGE_DIR` and `TOKENIZER_PATH` hold `PASS`, `KEY` and `TOKEN` without naming one,
/// and their values are ordinary words and paths that redaction would cut out of every
/// output.
fn sounds_secret(name: &str) -> bool {
    credential::is_credential_name(name)
}

/// A name that says it counts or bounds something: `MAX_TOKENS`, `TOKEN_LIMIT`.
fn names_a_count(name: &str) -> bool {
    name.to_ascii_uppercase()
        .split('_')
        .any(|word| matches!(word, "MAX" | "MIN" | "LIMIT" | "COUNT" | "BUDGET" | "TOKENS"))
}

/// A whole number or a decimal: `8080`, `-1`, `0.5`.
fn is_number(value: &str) -> bool {
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    let mut parts = digits.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

/// A value that says what it is and holds no credential: a number, a boolean, or the
/// absolute path of something that exists.
fn is_plain(value: &str) -> bool {
    const BOOLEANS: [&str; 6] = ["true", "false", "yes", "no", "on", "off"];
    is_number(value)
        || BOOLEANS.iter().any(|b| value.eq_ignore_ascii_case(b))
        || (std::path::Path::new(value).is_absolute() && std::path::Path::new(value).exists())
}

/// A key, a flag or a word that names a credential: `token`, `apiKey`, `clientSecret`,
/// `Authorization`, `--api-key`, `Bearer`, `Basic`. `maxTokens` is a count, not one; the
/// words are those of [`sounds_secret`], and `Basic` (an `Authorization` scheme).
fn names_a_credential(text: &str) -> bool {
    credential::words(text).any(|word| credential::is_credential_word(&word) || word == "BASIC")
}

/// Whether a string at `path` carries credentials: under `headers`, `env` or
/// `environment`, or under a key that names a credential (`token`, `apiKey`, `auth`).
fn is_secret_place(path: &[String]) -> bool {
    // A path's items are keys, an array's items `key[i]`: the string's own key is its last
    // item unless that is an array's item.
    let own = path.last().filter(|key| !key.contains('['));
    let containers = &path[..path.len() - usize::from(own.is_some())];
    let key = |item: &String| item.split('[').next().unwrap_or_default().to_owned();
    containers
        .iter()
        .map(key)
        .any(|key| ["headers", "env", "environment"].iter().any(|k| key.eq_ignore_ascii_case(k)))
        || path.iter().map(key).any(|key| names_a_credential(&key))
}

/// A word after which a credential comes: a flag (`--token`, `--api-key=`), a label
/// (`X-Api-Key:`, `token=`) or a scheme (`Bearer`) that names one.
fn is_secret_lead(word: &str) -> bool {
    let word = word.trim_matches(|c| c == '"' || c == '\'');
    (word.starts_with('-')
        || word.ends_with(['=', ':'])
        || word.chars().all(|c| c.is_ascii_alphabetic()))
        && names_a_credential(word)
}

/// Whether `text[start..end]`, an expanded value, stands where a string carries a
/// credential of its own: in a URL's user and password, query or fragment
/// (`https://u:${P}@host`, `?key=${K}`), or after a word that names a credential in the
/// same string (`--token=${T}`, `--token ${T}`, `Bearer ${T}`).
fn is_secret_part(text: &str, start: usize, end: usize) -> bool {
    let word_start = text[..start]
        .char_indices()
        .rfind(|(_, c)| c.is_whitespace())
        .map_or(0, |(i, c)| i + c.len_utf8());
    let word_end = text[end..].find(char::is_whitespace).map_or(text.len(), |i| end + i);
    let word = &text[word_start..word_end];
    let (start, end) = (start - word_start, end - word_start);
    let overlaps = |from: usize, to: usize| start < to && end > from;
    // The URL's authority's user and password, and its query and fragment.
    let authority = word.find("://").map_or(0, |i| i + 3);
    let authority_end =
        word[authority..].find(['/', '?', '#']).map_or(word.len(), |i| authority + i);
    if word[..authority].contains("://")
        && let Some(at) = word[authority..authority_end].rfind('@')
        && overlaps(authority, authority + at)
    {
        return true;
    }
    if let Some(query) = word[authority..].find(['?', '#'])
        && end > authority + query
    {
        return true;
    }
    // A label in the same word (`--token=`, `X-Api-Key:`), else the word before it
    // (`--token ${T}`, `Bearer ${T}`).
    let label = &word[..start];
    if !label.is_empty() {
        return is_secret_lead(label);
    }
    text[..word_start].split_whitespace().next_back().is_some_and(is_secret_lead)
}

/// Variables that describe the machine or name a place rather than hold credentials.
/// Redacting their values (a home folder, a user name, a region such as `us`) would mangle
/// ordinary paths and words in every output: `${API_USER}` = `user` made `user-agent` read
/// `[redacted]-agent`.
///
/// Besides the machine's own (`HOME`, `USER`, `XDG_*`…), a name whose last word says what
/// it names (`*_USER`, `*_HOST`, `*_PORT`, `*_REGION`, `*_ORG`…) is public unless another
/// of its words names a credential ([`sounds_secret`]: `TOKEN`, `KEY`, `PASSWORD`…); `*_URL` and
/// `*_ENDPOINT` are when their value carries no user, password or query.
fn is_public(name: &str, value: &str) -> bool {
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
    if is_machine(name) {
        return true;
    }
    if sounds_secret(name) {
        return false;
    }
    let upper = name.to_ascii_uppercase();
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

/// A variable of the machine's own: `HOME`, `USER`, `PWD`, `XDG_*`, `LC_*`…
fn is_machine(name: &str) -> bool {
    const MACHINE: [&str; 9] =
        ["HOME", "USER", "LOGNAME", "PWD", "PATH", "SHELL", "TMPDIR", "LANG", "TERM"];
    MACHINE.contains(&name) || name.starts_with("XDG_") || name.starts_with("LC_")
}

/// An environment variable name: a letter or `_`, then letters, digits, `_`.
pub(crate) fn is_name(name: &str) -> bool {
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
            "LISTEN" => Some("8080".into()),
            "MODE" => Some("prod".into()),
            "SHORT" => Some("k9x2".into()),
            "DEBUG" => Some("true".into()),
            "DATA" => Some("/tmp".into()),
            "SITE" => Some("production-eu".into()),
            "API_KEY" => Some("ab12".into()),
            "MAX_TOKENS" => Some("4096".into()),
            "MONKEY" => Some("banana".into()),
            "TOKENIZER_PATH" => Some("tok.json".into()),
            "GH_PAT" => Some("ghp_x1".into()),
            "dbPw" => Some("pw-1".into()),
            _ => None,
        }
    }

    fn check(mut value: Value, expected: expect_test::Expect) {
        let shown = match expand(&mut value, &env, "/ws") {
            Ok(found) => {
                format!("{value}\nsecrets: {:?}\ninputs: {:?}", found.secrets, found.inputs)
            }
            Err(ExpandError::Unterminated { path }) => format!("unterminated at {path}"),
            Err(ExpandError::Malformed { path, reference, why }) => {
                format!("malformed {reference} at {path}: {why}")
            }
            Err(ExpandError::Required { path, variable, message }) => {
                format!("required {variable} at {path}: {message}")
            }
            Err(ExpandError::Unset(unset)) => unset
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

    /// A value neither secret nor public by its variable's name is redacted where it
    /// stands for a credential, or when it is long enough to be one; a port, a word, a
    /// boolean or a folder elsewhere is not.
    #[test]
    fn short_values_are_secrets_only_where_credentials_stand() {
        let each = ["LISTEN", "MODE", "SHORT", "DEBUG", "DATA"].map(|v| format!("${{{v}}}"));
        let elsewhere = json!({"args": each, "url": format!("http://127.0.0.1:{}/{}", each[0], each[1]), "command": each.join(" ")});
        check(
            elsewhere,
            expect![[r#"
                {"args":["8080","prod","k9x2","true","/tmp"],"command":"8080 prod k9x2 true /tmp","url":"http://127.0.0.1:8080/prod"}
                secrets: []
                inputs: []"#]],
        );
        check(
            json!({"mcpServers": {"x": {
                "env": {"A": "${LISTEN}", "B": "${DATA}"},
                "headers": {"X-Mode": "${MODE}"},
                "auth": {"token": "${DEBUG}"},
                "args": ["--token", "${SHORT}", "--mode", "${MODE}", "--api-key=${LISTEN}", "Bearer ${DEBUG}"],
                "url": "http://u:${SHORT}@127.0.0.1/x?mode=${MODE}",
            }}}),
            expect![[r#"
                {"mcpServers":{"x":{"args":["--token","k9x2","--mode","prod","--api-key=8080","Bearer true"],"auth":{"token":"true"},"env":{"A":"8080","B":"/tmp"},"headers":{"X-Mode":"prod"},"url":"http://u:k9x2@127.0.0.1/x?mode=prod"}}}
                secrets: ["k9x2", "8080", "true", "true", "8080", "/tmp", "prod", "k9x2", "prod"]
                inputs: []"#]],
        );
        // Long values are secrets anywhere; a name that sounds secret makes any value one,
        // but for a count; the machine's own are never.
        check(
            json!({"a": "${SITE}", "b": "${API_KEY}", "c": "${MAX_TOKENS}", "env": {"H": "${HOME}"}}),
            expect![[r#"
                {"a":"production-eu","b":"ab12","c":"4096","env":{"H":"/home/u"}}
                secrets: ["production-eu", "ab12"]
                inputs: []"#]],
        );
    }

    /// Words end at any whitespace, a no-break space too.
    #[test]
    fn values_after_wide_whitespace() {
        check(
            json!({"a": "Bearer\u{a0}${MODE}", "b": "mode\u{2003}${MODE}"}),
            expect![[r#"
                {"a":"Bearer prod","b":"mode prod"}
                secrets: ["prod"]
                inputs: []"#]],
        );
    }

    /// A name sounds secret by its words, as `toolmux_core::credential` splits them (its
    /// tests hold the names): digits split words, so `S3PWD`'s short value is a secret as
    /// `S3_PWD`'s is.
    #[test]
    fn secret_names_by_their_words() {
        assert!(sounds_secret("GITHUB_TOKEN") && sounds_secret("S3PWD"));
        assert!(!sounds_secret("TOKENIZER_PATH"));
        assert!(is_secret("S3PWD", "pw-1", false));
        assert!(!is_secret("MONKEY", "pw-1", false));
    }

    /// Values of names that only hold a credential's word inside another word are
    /// ordinary values: `MONKEY` = `banana` is not cut out of every output.
    #[test]
    fn names_with_a_credential_inside_a_word_are_not_secrets() {
        check(
            json!({"args": ["${MONKEY}", "${TOKENIZER_PATH}", "${GH_PAT}", "${dbPw}"]}),
            expect![[r#"
                {"args":["banana","tok.json","ghp_x1","pw-1"]}
                secrets: ["ghp_x1", "pw-1"]
                inputs: []"#]],
        );
    }

    #[test]
    fn words_of_keys_and_flags() {
        for credential in [
            "token",
            "apiKey",
            "x-api-key",
            "clientSecret",
            "Authorization",
            "--password",
            "GITHUB_PAT_TOKEN",
            "accessToken",
            "--s3pwd",
        ] {
            assert!(names_a_credential(credential), "{credential}");
        }
        for plain in ["maxTokens", "url", "args", "mode", "--port", "keep"] {
            assert!(!names_a_credential(plain), "{plain}");
        }
    }

    #[test]
    fn plain_and_default() {
        check(
            json!({"a": "Bearer ${TOKEN}", "b": "${MISSING:-fallback}", "c": "${TOKEN:-x}", "d": "${EMPTY}", "e": "${EMPTY:-when empty}"}),
            expect![[r#"
                {"a":"Bearer s3cret-token","b":"fallback","c":"s3cret-token","d":"","e":"when empty"}
                secrets: ["s3cret-token", "s3cret-token"]
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
            json!({"url": "https://x/${parameters.id}?q=${parameters.q}", "hook": "${CLAUDE_PROJECT_DIR}/h.sh ${TOOLMUX_PROJECT_DIR}", "literal": "$${"}),
            expect![[r#"
                {"hook":"/ws/h.sh /ws","literal":"${","url":"https://x/${parameters.id}?q=${parameters.q}"}
                secrets: []
                inputs: []"#]],
        );
    }

    /// A `${` that nothing closes is an error, where it was kept as text: `root: ${ROOT`
    /// was a folder of that name.
    #[test]
    fn an_unterminated_reference_is_an_error() {
        check(json!({"a": "ok", "fs": {"root": "${TOKEN"}}), expect!["unterminated at fs.root"]);
        check(json!({"x": ["a ${"]}), expect!["unterminated at x[0]"]);
        check(json!({"x": "${NOPE:-${TOKEN}"}), expect!["unterminated at x"]);
        // An unset variable elsewhere is not what is told first.
        check(json!({"a": "${NOPE}", "b": "${TOKEN"}), expect!["unterminated at b"]);
    }

    /// A default may hold references of its own, expanded only when it is used.
    #[test]
    fn defaults_nest() {
        check(
            json!({"a": "${NOPE:-${NOPE2:-/srv}}", "b": "${NOPE:-${MODE}-x}", "c": "${MODE:-${NOPE}}", "d": "${NOPE:-$${MODE}}", "e": "${EMPTY:-${NOPE:-${LISTEN}}}"}),
            expect![[r#"
                {"a":"/srv","b":"prod-x","c":"prod","d":"${MODE}","e":"8080"}
                secrets: []
                inputs: []"#]],
        );
        check(json!({"a": "${NOPE:-${NOPE2}}"}), expect!["unset NOPE2 at a"]);
    }

    /// The value finally used is judged by its own variable's name and by the names of the
    /// variables it stands in for: `${API_TOKEN:-${FALLBACK}}` is a token whatever
    /// `FALLBACK` is called, and `${NOPE:-${TOKEN}}` a token wherever it stands.
    #[test]
    fn a_nested_value_is_judged_by_every_name_it_stands_for() {
        check(
            json!({"args": ["${NOPE:-${TOKEN}}", "${API_TOKEN:-${MODE}}", "${NOPE:-${MODE}}", "${API_TOKEN:-${HOME}}"], "url": "http://h/?key=${NOPE:-${LISTEN}}"}),
            expect![[r#"
                {"args":["s3cret-token","prod","prod","/home/u"],"url":"http://h/?key=8080"}
                secrets: ["s3cret-token", "prod", "8080"]
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

    /// The shell's `-`, `+` and `?` operators, with and without `:`, as a shell reads
    /// them; they were left as text.
    #[test]
    fn the_shells_operators() {
        check(
            json!({
                "unset": ["${NOPE-d}", "${NOPE:-d}", "${NOPE+a}", "${NOPE:+a}"],
                "empty": ["${EMPTY-d}", "${EMPTY:-d}", "${EMPTY+a}", "${EMPTY:+a}"],
                "set": ["${MODE-d}", "${MODE:-d}", "${MODE+a}", "${MODE:+a-${LISTEN}}", "${MODE:?x}", "${EMPTY?x}"],
            }),
            expect![[r#"
                {"empty":["","d","a",""],"set":["prod","prod","a","a-8080","prod",""],"unset":["d","d","",""]}
                secrets: []
                inputs: []"#]],
        );
        check(
            json!({"a": {"b": "x ${NOPE:?set NOPE to the repo}"}}),
            expect!["required NOPE at a.b: set NOPE to the repo"],
        );
        check(json!({"a": "${EMPTY:?}"}), expect!["required EMPTY at a: "]);
        check(json!({"a": "${NOPE?}"}), expect!["required NOPE at a: "]);
        // A required variable stops expansion before an unset one is told.
        check(json!({"a": "${OTHER}", "b": "${NOPE:?m}"}), expect!["required NOPE at b: m"]);
    }

    /// A reference that looks meant as a variable's but is none is an error, where it was
    /// left as text; templates and VS Code's forms are not.
    /// References nested in defaults far past any real use are refused quickly, with the
    /// reference and the limit, where each level recursed (and scanned the rest of the text
    /// again) until the stack overflowed.
    #[test]
    fn references_nested_too_deep_are_refused() {
        let deep = |levels: usize| "${A:-".repeat(levels) + "x" + &"}".repeat(levels);
        let mut value = json!({"a": deep(MAX_NESTING)});
        assert!(expand(&mut value, &env, "/ws").is_ok(), "{MAX_NESTING} levels are read");
        assert_eq!(value["a"], "x");
        for levels in [MAX_NESTING + 1, 50_000] {
            let mut value = json!({"a": deep(levels)});
            match expand(&mut value, &env, "/ws") {
                Err(ExpandError::Malformed { reference, why, .. }) => {
                    assert_eq!(reference, "${A");
                    assert!(why.contains("more than 32 deep"), "{why}");
                }
                other => panic!("{levels}: {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_references_are_errors() {
        check(
            json!({"a": "${}"}),
            expect![
                "malformed ${} at a: is empty: name a variable (`${VAR}`), or a literal `${` is written `$${`"
            ],
        );
        check(
            json!({"x": ["${1BAD}"]}),
            expect![
                "malformed ${1BAD} at x[0]: is not a variable's name (a name starts with a letter or `_`), or a literal `${` is written `$${`"
            ],
        );
        for bad in ["${:-x}", "${ }", "${:=x}"] {
            let mut value = json!({"a": bad});
            match expand(&mut value, &env, "/ws") {
                Err(ExpandError::Malformed { reference, .. }) => assert_eq!(reference, bad),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    /// What only a shell reads (a positional or special parameter, an operator toolmux
    /// does not take) is kept as written for the shell the value may reach (`sh -c`), and
    /// named with its key for a warning: refusing it refused servers run by `sh -c '...'`
    /// that load in the programs whose files toolmux reads.
    #[test]
    fn shell_references_are_kept_and_named() {
        let shell = [
            "${1}",
            "${1%.txt}",
            "${10:-x}",
            "${#}",
            "${@}",
            "${#VAR}",
            "${!X}",
            "${VAR:=x}",
            "${VAR%.txt}",
            "${VAR#x}",
            "${VAR/a/b}",
            "${VAR^^}",
            "${VAR:1:2}",
        ];
        for kept in shell {
            let mut value = json!({"args": ["-c", format!("echo {kept}")]});
            let found = expand(&mut value, &env, "/ws").unwrap_or_else(|e| panic!("{kept}: {e:?}"));
            assert_eq!(value, json!({"args": ["-c", format!("echo {kept}")]}));
            assert_eq!(found.shell, [format!("`{kept}` in args[1]")]);
        }
        check(
            json!({"a": "${parameters.id}", "b": "${config:editor.x}", "c": "${command:pick}", "d": "${1.x}", "e": "$${1BAD}"}),
            expect![[r#"
                {"a":"${parameters.id}","b":"${config:editor.x}","c":"${command:pick}","d":"${1.x}","e":"${1BAD}"}
                secrets: []
                inputs: []"#]],
        );
    }

    /// VS Code's variables: the workspace's name and the path separator are filled in, the
    /// editor's are refused unless a variable of that name is set.
    #[test]
    fn vscode_predefined_variables() {
        check(
            json!({"a": "${workspaceFolderBasename}", "b": "${workspaceFolder}${pathSeparator}x${/}y"}),
            expect![[r#"
                {"a":"ws","b":"/ws/x/y"}
                secrets: []
                inputs: []"#]],
        );
        check(
            json!({"a": "${cwd}/x"}),
            expect![
                "malformed ${cwd} at a: is one of VS Code's variables about the editor (its open file, its folders), which toolmux has no editor to fill in: write the path, or use `${workspaceFolder}` (the project's folder)"
            ],
        );
        let set = |name: &str| (name == "file").then(|| "/f".to_owned());
        let mut value = json!({"a": "${file}"});
        assert!(expand(&mut value, &set, "/ws").is_ok());
        assert_eq!(value, json!({"a": "/f"}));
    }

    /// A server entry's `command`, `args` and `cwd` (and Zed's older `command: {path, args,
    /// env}`) read its own `env` first; its other keys, other entries and other sections
    /// read the process's environment only.
    #[test]
    fn a_servers_own_env_comes_first_in_its_command_and_args() {
        check(
            json!({"context_servers": {"z": {"command": {
                "path": "${BIN}", "args": ["${MODE}", "${TOKEN}"], "env": {"MODE": "dev", "BIN": "zed-mcp"}
            }}}}),
            expect![[r#"
                {"context_servers":{"z":{"command":{"args":["dev","s3cret-token"],"env":{"BIN":"zed-mcp","MODE":"dev"},"path":"zed-mcp"}}}}
                secrets: ["s3cret-token"]
                inputs: []"#]],
        );
        check(
            json!({"mcpServers": {
                "a": {"cwd": "/x/${MODE}", "env": {"MODE": "${DATA:-x}", "ONLY": "y"}, "url": "${ONLY}"},
                "b": {"args": ["${ONLY}"]}
            }, "other": {"args": ["${ONLY}"], "env": {"ONLY": "y"}}}),
            expect![
                "unset ONLY at mcpServers.a.url; unset ONLY at mcpServers.b.args[0]; unset ONLY at other.args[0]"
            ],
        );
    }
}
