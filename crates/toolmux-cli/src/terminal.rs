//! Questions of a call asked of the person at the terminal (stderr, stdin): approvals of
//! calls that ask, an agent's questions, a server's forms (elicitation) and URLs to open.
//! Used by `agent run` and `tools call` when both stdin and stderr are terminals.

use async_trait::async_trait;
use serde_json::{Map, Value};
use std::io::{BufRead as _, Write as _};
use toolmux::toolmux_core::{
    ApprovalDecision, ApprovalRequest, ElicitationAction, ElicitationRequest, ElicitationResponse,
    InteractionHandler, ToolError, UrlElicitationRequest,
};

/// Tries per field before a form is given up (cancelled).
const TRIES: usize = 3;

/// The person at the terminal.
#[derive(Debug, Default)]
pub(crate) struct Terminal {
    /// Tools the person allowed for the rest of the session (`a` to an approval), and
    /// those allowed in the project.
    allowed: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Where the project's approvals are kept (`p` to an approval), when there is a project.
    approvals: Option<std::path::PathBuf>,
}

/// The project's approvals file, beside the configuration (`.toolmux/approvals.json`): what
/// a person allowed "in this project", which `toolmux` loads at every start. The file tools
/// never change it.
pub(crate) const APPROVALS_FILE: &str = ".toolmux/approvals.json";

impl Terminal {
    /// The person at the terminal of the project in `project_dir`: what they allowed in
    /// the project before is allowed without asking.
    pub(crate) fn for_project(project_dir: &std::path::Path) -> Terminal {
        let path = project_dir.join(APPROVALS_FILE);
        let allowed = match crate::files::read_regular(&path, crate::files::APPROVALS) {
            Ok(bytes) => match approved_in(&bytes) {
                Ok(approved) => approved.into_iter().collect(),
                Err(e) => {
                    eprintln!(
                        "warning: {} is not a file of approvals toolmux can read ({e}); calls \
                         that ask are asked (delete it to start anew)",
                        path.display()
                    );
                    Default::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
            Err(e) => {
                eprintln!(
                    "warning: cannot read the approvals in {}: {e}; calls that ask are asked",
                    path.display()
                );
                Default::default()
            }
        };
        Terminal { allowed: std::sync::Mutex::new(allowed), approvals: Some(path) }
    }

    /// Adds `key` to the project's approvals file (replaced whole through a temporary
    /// file); a failure is told, the call allowed all the same. A file that is there but
    /// cannot be read (over the size limit, not JSON, not readable) is left as it is, the
    /// approval kept for this session only: written anew, it would lose every approval
    /// it held. So is something other than a regular file in its place (a FIFO, a folder,
    /// a device), which someone put there on purpose: the rename would replace it.
    fn save_approval(&self, key: &str) {
        let Some(path) = &self.approvals else { return };
        let unreadable = |why: String| {
            eprintln!(
                "warning: the approval of {key} is kept for this session only, and {} is left \
                 as it is: {why} (fix or delete it to save approvals in the project)",
                path.display()
            );
        };
        let mut approved = match crate::files::read_regular(path, crate::files::APPROVALS) {
            Ok(bytes) => match approved_in(&bytes) {
                Ok(approved) => approved,
                Err(e) => return unreadable(format!("it is not a file of approvals ({e})")),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => match std::fs::metadata(path) {
                Ok(found) if !found.is_file() => {
                    let what = toolmux::toolmux_core::regular::kind_in_words(found.file_type());
                    eprintln!(
                        "warning: the approval of {key} is kept for this session only: {} is \
                         {}, not a regular file, and is left as it is (replace it with a file, \
                         or delete it, to save approvals in the project)",
                        path.display(),
                        what.unwrap_or("something")
                    );
                    return;
                }
                _ => return unreadable(format!("it cannot be read ({e})")),
            },
        };
        if approved.iter().any(|a| a == key) {
            return;
        }
        approved.push(key.to_owned());
        let approvals = serde_json::json!({ "approved": approved });
        let written = (|| -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut text =
                serde_json::to_string_pretty(&approvals).map_err(std::io::Error::other)?;
            text.push('\n');
            let how = toolmux::toolmux_core::Replace { private: false, durable: true };
            toolmux::toolmux_core::replace_file(path, text.as_bytes(), how)
        })();
        if let Err(e) = written {
            eprintln!("warning: the approval was not saved in {}: {e}", path.display());
        }
    }
}

/// The `approved` list of an [`APPROVALS_FILE`]: tool names, or rules on calls
/// (`fs__bash(git push *)`), allowed without asking.
fn approved_in(bytes: &[u8]) -> Result<Vec<String>, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let list = value.get("approved").and_then(Value::as_array).ok_or("no `approved` list")?;
    list.iter()
        .map(|a| a.as_str().map(str::to_owned).ok_or_else(|| format!("`{a}` is not a string")))
        .collect()
}

/// The terminal's input, read by one thread for the whole process: a question whose call
/// is cancelled or times out stops waiting at once and leaves no reader behind to swallow
/// the answer to the next question.
struct Input {
    /// Lines as typed; `None` once the input has ended. Held by the question being asked,
    /// so that questions of calls running at once take turns.
    lines: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Option<String>>>,
    /// Stdin is a terminal: what is typed before a question is shown is no answer to it.
    /// (From a pipe every line is an answer, in order.)
    terminal: bool,
}

/// One question at a time at the terminal (a form's fields are asked in one turn).
struct Turn {
    lines: tokio::sync::MutexGuard<'static, tokio::sync::mpsc::UnboundedReceiver<Option<String>>>,
    /// The input has ended.
    ended: bool,
}

impl Turn {
    /// Waits until no other question is being asked.
    async fn take() -> Turn {
        let input = input();
        let mut turn = Turn { lines: input.lines.lock().await, ended: false };
        // Lines typed before the turn began (an answer to a question whose call was
        // cancelled meanwhile) answer nothing; within the turn, lines typed ahead answer
        // the next questions.
        while input.terminal
            && let Ok(line) = turn.lines.try_recv()
        {
            turn.ended |= line.is_none();
        }
        turn
    }

    /// Shows `prompt` on stderr and reads one line; `None` at the end of input.
    async fn ask(&mut self, prompt: &str) -> Option<String> {
        if self.ended {
            return None;
        }
        if !prompt.is_empty() {
            let mut stderr = std::io::stderr().lock();
            // The question is a server's or an agent's words: shown, never acted on.
            let _ = write!(stderr, "{}", crate::commands::for_stderr(prompt));
            let _ = stderr.flush();
        }
        let line = self.lines.recv().await.flatten();
        self.ended = line.is_none();
        line
    }
}

fn input() -> &'static Input {
    static INPUT: std::sync::OnceLock<Input> = std::sync::OnceLock::new();
    INPUT.get_or_init(|| {
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        let reader = move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut line = String::new();
                let line = match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_owned()),
                };
                let ended = line.is_none();
                // Every later question sees the end too.
                if sender.send(line).is_err() || ended {
                    let _ = sender.send(None);
                    return;
                }
            }
        };
        // A process whose thread cannot start has no terminal questions answered: the
        // channel's sender is gone, and every question reads the end of input.
        let _ = std::thread::Builder::new().name("terminal-input".into()).spawn(reader);
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
        Input { lines: tokio::sync::Mutex::new(lines), terminal }
    })
}

/// The next line of stdin, after showing `prompt` on stderr (none when empty); `None` at
/// the end of input. Shares the one reader of stdin with the questions of calls, taking
/// turns with them.
pub(crate) async fn next_line(prompt: &str) -> Option<String> {
    Turn::take().await.ask(prompt).await
}

impl Terminal {
    /// Asks `prompt` in a turn of its own; `None` at the end of input.
    async fn ask(prompt: String) -> Option<String> {
        Turn::take().await.ask(&prompt).await
    }

    /// One field of a form, asked until it parses (at most [`TRIES`] times); `Ok(None)`
    /// when left empty and optional, `Err(())` when the person gave up.
    async fn field(
        turn: &mut Turn,
        name: &str,
        schema: &Value,
        required: bool,
    ) -> Result<Option<Value>, ()> {
        let title = schema.get("title").and_then(Value::as_str).unwrap_or(name);
        let choices = choices(schema);
        let kind = schema.get("type").and_then(Value::as_str).unwrap_or("string");
        let mut hint = match (&choices[..], kind) {
            ([], "boolean") => "y/n".to_owned(),
            ([], kind) => kind.to_owned(),
            (choices, _) => {
                let each = choices.iter().enumerate();
                each.map(|(i, (_, label))| format!("{} {label}", i + 1))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let default = schema.get("default");
        if let Some(default) = default {
            hint.push_str(&format!(", default {default}"));
        }
        if !required {
            hint.push_str(", optional");
        }
        let about = match schema.get("description").and_then(Value::as_str) {
            Some(description) => format!(" ({description})"),
            None => String::new(),
        };
        for _ in 0..TRIES {
            let Some(answer) = turn.ask(&format!("  {title}{about} [{hint}]: ")).await else {
                return Err(());
            };
            let answer = answer.trim();
            if answer.is_empty() {
                match (default, required) {
                    (Some(default), _) => return Ok(Some(default.clone())),
                    (None, false) => return Ok(None),
                    (None, true) => continue,
                }
            }
            if let Some(value) = parse(answer, kind, &choices) {
                return Ok(Some(value));
            }
        }
        Err(())
    }
}

/// The choices of an enumerated field: each value and its label.
fn choices(schema: &Value) -> Vec<(Value, String)> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let names = schema.get("enumNames").and_then(Value::as_array);
        return values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let label = names.and_then(|n| n.get(i)).and_then(Value::as_str);
                (v.clone(), label.map_or_else(|| plain(v), str::to_owned))
            })
            .collect();
    }
    let options = schema.get("oneOf").or_else(|| schema.get("anyOf")).and_then(Value::as_array);
    options
        .into_iter()
        .flatten()
        .filter_map(|o| {
            let value = o.get("const")?.clone();
            let label =
                o.get("title").and_then(Value::as_str).map_or_else(|| plain(&value), str::to_owned);
            Some((value, label))
        })
        .collect()
}

fn plain(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

/// An answer as a value of the field: a choice by number or by name, else by type.
fn parse(answer: &str, kind: &str, choices: &[(Value, String)]) -> Option<Value> {
    if !choices.is_empty() {
        if let Ok(n) = answer.parse::<usize>()
            && let Some((value, _)) = n.checked_sub(1).and_then(|i| choices.get(i))
        {
            return Some(value.clone());
        }
        return choices
            .iter()
            .find(|(value, label)| plain(value) == answer || label.eq_ignore_ascii_case(answer))
            .map(|(value, _)| value.clone());
    }
    match kind {
        "boolean" => match answer.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" | "1" => Some(Value::Bool(true)),
            "n" | "no" | "false" | "0" => Some(Value::Bool(false)),
            _ => None,
        },
        "integer" => answer.parse::<i64>().ok().map(Value::from),
        "number" => {
            answer.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number)
        }
        _ => Some(Value::String(answer.to_owned())),
    }
}

#[async_trait]
impl InteractionHandler for Terminal {
    /// Asks; `a` allows the tool for the rest of the session (the process: every run of an
    /// `agent chat`), without asking again.
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        // "Always" covers what asked: a rule on calls (`fs__bash(git push *)`) for the calls
        // it asks about, not every command of the tool; else the tool.
        let on_calls = request.scope.as_deref();
        let key = on_calls.unwrap_or(&request.tool).to_owned();
        let allowed =
            |this: &Terminal| this.allowed.lock().unwrap_or_else(|e| e.into_inner()).contains(&key);
        if allowed(self) {
            return ApprovalDecision::Allow;
        }
        let always = match on_calls {
            Some(rule) => format!("always for `{rule}`"),
            None => "always this tool".to_owned(),
        };
        let project = if self.approvals.is_some() { "p: in this project too, " } else { "" };
        let prompt = format!(
            "\nallow {} {}? ({}) [y/N, {project}a: {always}] ",
            request.tool, request.arguments, request.reason
        );
        let answer = Terminal::ask(prompt).await;
        // Allowed for good while this question waited its turn.
        if allowed(self) {
            return ApprovalDecision::Allow;
        }
        match answer.as_deref().map(str::trim) {
            Some("y" | "Y" | "yes") => ApprovalDecision::Allow,
            Some("a" | "A" | "always") => {
                self.allowed.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                ApprovalDecision::Allow
            }
            Some("p" | "P" | "project") if self.approvals.is_some() => {
                self.save_approval(&key);
                self.allowed.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                ApprovalDecision::Allow
            }
            _ => ApprovalDecision::Deny { reason: "the user declined".to_owned() },
        }
    }

    async fn clarify(&self, question: &str) -> Option<String> {
        Terminal::ask(format!("\nthe agent asks: {question}\n> "))
            .await
            .filter(|a| !a.trim().is_empty())
    }

    /// A server's form: asked field by field, after the person agreed to answer.
    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        let answer = |action| Ok(ElicitationResponse { action, content: None });
        let prompt = format!("\na tool asks: {}\nanswer? [Y/n] ", request.message.trim());
        // The whole form in one turn: no other call's question comes between its fields.
        let mut turn = Turn::take().await;
        match turn.ask(&prompt).await.as_deref().map(str::trim) {
            None => return answer(ElicitationAction::Cancel),
            Some("n" | "N" | "no") => return answer(ElicitationAction::Decline),
            Some(_) => {}
        }
        let schema = &request.requested_schema;
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut content = Map::new();
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in properties.into_iter().flatten() {
            match Terminal::field(&mut turn, name, field, required.contains(&name.as_str())).await {
                Ok(Some(value)) => {
                    content.insert(name.clone(), value);
                }
                Ok(None) => {}
                Err(()) => return answer(ElicitationAction::Cancel),
            }
        }
        Ok(ElicitationResponse { action: ElicitationAction::Accept, content: Some(content) })
    }

    /// A server's request to open a URL (to sign in, say): shown, and accepted once the
    /// user says they went there.
    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        let why = match request.message.trim() {
            "" => String::new(),
            message => format!("{message}\n"),
        };
        let prompt = format!(
            "\na tool's server asks you to open this URL:\n{why}  {}\nopen it, finish there, then answer: done? [y/N] ",
            request.url
        );
        Ok(match Terminal::ask(prompt).await.as_deref().map(str::trim) {
            Some("y" | "Y" | "yes") => ElicitationAction::Accept,
            Some(_) => ElicitationAction::Decline,
            None => ElicitationAction::Cancel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_parse_by_type_and_choice() {
        assert_eq!(parse("y", "boolean", &[]), Some(json!(true)));
        assert_eq!(parse("No", "boolean", &[]), Some(json!(false)));
        assert_eq!(parse("maybe", "boolean", &[]), None);
        assert_eq!(parse("42", "integer", &[]), Some(json!(42)));
        assert_eq!(parse("4.5", "integer", &[]), None);
        assert_eq!(parse("4.5", "number", &[]), Some(json!(4.5)));
        assert_eq!(parse("hi there", "string", &[]), Some(json!("hi there")));
        let schema = json!({"type": "string", "oneOf": [
            {"const": "py", "title": "Python"}, {"const": "rs", "title": "Rust"}]});
        let options = choices(&schema);
        assert_eq!(parse("2", "string", &options), Some(json!("rs")));
        assert_eq!(parse("python", "string", &options), Some(json!("py")));
        assert_eq!(parse("rs", "string", &options), Some(json!("rs")));
        assert_eq!(parse("3", "string", &options), None);
        let listed = choices(&json!({"enum": ["a", "b"], "enumNames": ["Alpha", "Beta"]}));
        assert_eq!(listed, vec![(json!("a"), "Alpha".to_owned()), (json!("b"), "Beta".to_owned())]);
    }
}
