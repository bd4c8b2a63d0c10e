//! serde's names for what a key takes (`u64`, `a map`, `struct Defaults`) told in the words
//! of the person writing the file, with an example where one helps.

/// serde's "invalid type: FOUND, expected TYPE" (or "invalid value: …") at `path` told as
/// what the key takes and what the file gives; `None` for every other message.
pub(super) fn in_words(path: &str, message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))?;
    // The found value comes first and may itself hold ", expected " (a string's text).
    let (found, expected) = rest.rsplit_once(", expected ")?;
    let found = found_in_words(found);
    if is_top(path) && expected.starts_with("struct ") {
        return Some(not_a_mapping(&found));
    }
    let takes = takes(path, expected)?;
    Some(format!("expected {takes}; found {found}"))
}

/// `text` as it may be shown in an error: every control character (C0, DEL and C1, tab
/// and newline too) escaped as Rust writes it (`\u{1b}`, `\n`), so that a key or value
/// from the file cannot clear, colour or rewrite the terminal the error is printed on.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What to say of a file whose top level is `found` (told as [`found_in_words`] does)
/// rather than a mapping.
pub(super) fn not_a_mapping(found: &str) -> String {
    format!("the file must be a mapping of sections such as `fs:` and `mcpServers:`; found {found}")
}

/// What to say of settings at `path` (a struct's place) given as `found` (told as
/// [`value_in_words`] does): what serde's words become for a struct ([`in_words`]).
pub(super) fn not_settings(path: &str, found: &str) -> String {
    if is_top(path) {
        return not_a_mapping(found);
    }
    format!("{path}: expected {SETTINGS}; found {found}")
}

/// What a struct's place takes, in words.
const SETTINGS: &str = "a mapping of its settings (`key: value` entries)";

/// A top-level value of the file as [`in_words`] tells what was found.
pub(super) fn value_in_words(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "nothing".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            // A whole paragraph pasted as the file need not come back whole.
            let shown: String = s.chars().take(40).collect();
            let more = if shown.len() < s.len() { "…" } else { "" };
            format!("the string {:?}", format!("{shown}{more}"))
        }
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
    }
}

fn is_top(path: &str) -> bool {
    path.is_empty() || path == "."
}

/// serde's `Unexpected` (`string "soon"`, ``integer `3` ``, `sequence`) in words.
fn found_in_words(found: &str) -> String {
    let backticked = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .and_then(|v| v.strip_prefix('`'))
            .and_then(|v| v.strip_suffix('`'))
    };
    if let Some(text) = found.strip_prefix("string ") {
        return format!("the string {text}");
    }
    if let Some(v) = backticked("integer ")
        .or_else(|| backticked("floating point "))
        .or_else(|| backticked("boolean "))
    {
        return v.to_owned();
    }
    match found {
        "sequence" => "a list".to_owned(),
        "map" => "a mapping".to_owned(),
        "unit value" | "null" | "unit" => "nothing".to_owned(),
        other => other.to_owned(),
    }
}

/// What the key at `path` takes, in words, given serde's name of its type; `None` when
/// serde's words are the type's own (a custom `expecting`), which say it already.
fn takes(path: &str, expected: &str) -> Option<String> {
    // The key is the path's last name; an element of a list (`args[0]`) is named by its list.
    let last = path.rsplit('.').next().unwrap_or(path);
    let key = last.split('[').next().unwrap_or(last);
    let words = match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => whole_number(path, key, false),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => whole_number(path, key, true),
        "f32" | "f64" => "a number, such as 0.5".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a string" | "a borrowed string" => "a string".to_owned(),
        "path string" => "a path, such as ./data".to_owned(),
        "a sequence" => "a list, such as [a, b]".to_owned(),
        "a map" => "a mapping of names to values (`name: value` entries)".to_owned(),
        _ if expected.starts_with("struct ") => SETTINGS.to_owned(),
        _ => return None,
    };
    Some(words)
}

/// A whole number for `key`, in the unit its name gives: milliseconds for every duration
/// but a hook command's `timeout` (seconds, as Claude Code's hooks have it), bytes for
/// sizes.
fn whole_number(path: &str, key: &str, signed: bool) -> String {
    let lower = key.to_ascii_lowercase();
    if key == "timeout" && path.starts_with("hooks.") {
        return "a number of seconds, such as 60".to_owned();
    }
    let milliseconds = key.ends_with("Ms")
        || lower.ends_with("timeout")
        || lower.ends_with("ttl")
        || matches!(key, "cache" | "outputRetention");
    if milliseconds {
        return "a number of milliseconds, such as 30000".to_owned();
    }
    if lower.ends_with("bytes") {
        return "a number of bytes, such as 100000".to_owned();
    }
    if lower.ends_with("port") {
        return "a port number, such as 8080".to_owned();
    }
    if signed { "a whole number, such as -1 or 10" } else { "a whole number, such as 10" }
        .to_owned()
}
