//! The permission stage: allow / deny / ask rules on full tool names, with globs, or on
//! what tools are, with selectors (`@write`, `@destructive`); and rules on calls, which
//! name what a call acts on in parentheses after the tools: `fs__bash(git *)` (the
//! commands a shell tool runs), `fs__write(src/**)` (the paths a file tool touches),
//! `github__*(owner=acme)` (an argument, for tools with neither).
//!
//! Deny wins over ask, ask over allow. With no allow rule every tool not denied is allowed;
//! with allow rules, a tool matching none of them is denied, and a call of a tool allowed
//! only by rules on calls must have every command it runs (each of `a && b | c`) and every
//! path it touches allowed by one of them. A command line that cannot be judged command by
//! command (`$(…)`, backquotes) is never allowed by a rule on calls: it needs approval.
//! Deny and ask rules also see the commands under wrappers (`sudo rm`, `bash -c 'rm …'`,
//! `xargs rm`), so wrapping a denied command does not run it.

use crate::glob::{glob_match, path_match};
use crate::shellwords;
use serde_json::Value;
use std::sync::Arc;
use toolmux_core::{PermissionClass, Subject, SubjectKind, ToolAnnotations};

/// The selectors a rule may give instead of a glob, each with what it matches.
pub const SELECTORS: &[(&str, &str)] = &[
    ("@readOnly", "tools annotated read-only"),
    ("@destructive", "tools that may destroy data (annotated destructive, not read-only)"),
    ("@openWorld", "tools annotated as reaching beyond the machine"),
    ("@read", "tools of permission class read, or read-only tools of no class"),
    ("@write", "tools of permission class write, or tools of no class that are not read-only"),
    ("@execute", "tools of permission class execute (they run programs)"),
    ("@network", "tools of permission class network, or open-world tools of no class"),
];

/// Whether `rule` (a glob over full names, or a selector of [`SELECTORS`]) matches the
/// tool `tool` with annotations `a`.
pub fn rule_matches(rule: &str, tool: &str, a: &ToolAnnotations) -> bool {
    let Some(selector) = rule.strip_prefix('@') else { return glob_match(rule, tool) };
    let class = a.permission;
    match selector {
        "readOnly" => a.read_only,
        "destructive" => a.destructive && !a.read_only,
        "openWorld" => a.open_world,
        "read" => class == Some(PermissionClass::Read) || (class.is_none() && a.read_only),
        "write" => class == Some(PermissionClass::Write) || (class.is_none() && !a.read_only),
        "execute" => class == Some(PermissionClass::Execute),
        "network" => class == Some(PermissionClass::Network) || (class.is_none() && a.open_world),
        _ => false,
    }
}

/// The rule on calls an [`Permission::Ask`] text names (`rule \`permissions.ask:
/// fs__bash(git push *)\` (…)`), for an approval that may stand for that rule's calls.
pub(crate) fn asking_rule_on_calls(ask: &str) -> Option<&str> {
    let rule = ask.strip_prefix("rule `permissions.ask: ")?.split('`').next()?;
    rule.contains('(').then_some(rule)
}

/// A rule split into the tools it names and, for a rule on calls, what of a call it
/// names: `fs__bash(git *)` is `fs__bash` and `git *`.
pub fn split_rule(rule: &str) -> Result<(&str, Option<&str>), String> {
    let Some(open) = rule.find('(') else {
        if rule.contains(')') {
            return Err(format!("rule `{rule}` has a `)` without a `(`"));
        }
        return Ok((rule, None));
    };
    let Some(spec) = rule[open + 1..].strip_suffix(')') else {
        return Err(format!(
            "rule `{rule}` does not end with `)`; a rule on calls is written `TOOL(WHAT)`, \
             as in `fs__bash(git *)`"
        ));
    };
    let tools = rule[..open].trim_end();
    if tools.is_empty() {
        return Err(format!("rule `{rule}` names no tool before `(`; write `*({spec})` for all"));
    }
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(format!(
            "rule `{rule}` has nothing between its parentheses; name a command, a path or \
             `argument=glob`, or leave the parentheses off to match every call"
        ));
    }
    Ok((tools, Some(spec)))
}

/// Refuses a rule of `rules` that looks like a selector (`@…`) but is none of
/// [`SELECTORS`], naming it and the selectors.
pub fn check_selectors(rules: &[String]) -> Result<(), String> {
    for rule in rules.iter().filter(|r| r.starts_with('@')) {
        if !SELECTORS.iter().any(|(s, _)| s == rule) {
            let known: Vec<&str> = SELECTORS.iter().map(|(s, _)| *s).collect();
            return Err(format!(
                "unknown selector `{rule}`; the selectors are {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// The rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermissionRules {
    /// Globs of tools that may run; empty means all.
    pub allow: Vec<String>,
    /// Globs of tools that never run.
    pub deny: Vec<String>,
    /// Globs of tools that run only after approval.
    pub ask: Vec<String>,
}

/// What the rules say of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// Run it.
    Allow,
    /// Refuse it; the text says which rule and how to allow it.
    Deny(String),
    /// Ask the context's approval handler; the text names the rule.
    Ask(String),
    /// It depends on the call: rules on calls apply ([`CallRules::judge`]).
    Check(Arc<CallRules>),
}

/// The rules on calls that apply to one tool, with what its plain rules say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallRules {
    kind: Option<SubjectKind>,
    deny: Vec<CallRule>,
    ask: Vec<CallRule>,
    allow: Vec<CallRule>,
    /// A plain ask rule naming the tool, as the approval request gives it.
    asked: Option<String>,
    /// Whether a plain allow rule names the tool, or there are no allow rules.
    allowed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct CallRule {
    rule: String,
    matcher: Matcher,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    /// A command's words; `rest` lets more words follow (`git *`, `npm test:*`).
    Command { words: Vec<String>, rest: bool },
    /// A `.gitignore`-style path line.
    Path(String),
    /// One argument's value, as text, against a glob.
    Argument { key: String, glob: String },
}

impl Matcher {
    /// How `spec` reads for a tool whose calls act on `kind`; `None` when it cannot apply.
    fn new(spec: &str, kind: Option<SubjectKind>) -> Option<Matcher> {
        match kind {
            Some(SubjectKind::Path) => Some(Matcher::Path(spec.to_owned())),
            Some(SubjectKind::Command) => {
                let mut words = shellwords::split(spec).commands.into_iter().next()?;
                let mut rest = false;
                if let Some(last) = words.last_mut() {
                    if last == "*" {
                        words.pop();
                        rest = true;
                    } else if let Some(stem) = last.strip_suffix(":*") {
                        *last = stem.to_owned();
                        rest = true;
                        if last.is_empty() {
                            words.pop();
                        }
                    }
                }
                Some(Matcher::Command { words, rest })
            }
            None => {
                let (key, glob) = spec.split_once('=')?;
                let key = key.trim();
                let valid = key.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                    && key.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c));
                valid.then(|| Matcher::Argument {
                    key: key.to_owned(),
                    glob: glob.trim().to_owned(),
                })
            }
        }
    }

    /// Whether it names the output redirection `operator` at word `at` of the commands it
    /// matches: the same operator there, followed by a glob for its target or by the rule's
    /// trailing `*` (`fs__bash(ls > *)`). A duplication (`2>&1`) or a `/dev/null` target in a
    /// rule names no file, so `fs__bash(make 2>/dev/null *)` does not cover `> Makefile`.
    fn redirects(&self, at: usize, operator: &str) -> bool {
        let Matcher::Command { words, rest } = self else { return false };
        words.get(at).is_some_and(|w| w == operator)
            && words.get(at + 1).map_or(*rest, |target| target != "/dev/null")
    }

    /// Whether this matches every call whatever it does (`fs__bash(*)`).
    fn everything(&self) -> bool {
        match self {
            Matcher::Command { words, rest } => words.is_empty() && *rest,
            Matcher::Path(p) => p == "*" || p == "**",
            Matcher::Argument { .. } => false,
        }
    }

    fn command(&self, command: &[String]) -> bool {
        let Matcher::Command { words, rest } = self else { return false };
        let fits = if *rest { command.len() >= words.len() } else { command.len() == words.len() };
        fits && words.iter().zip(command).all(|(p, w)| glob_match(p, w))
    }

    fn path(&self, path: &str) -> bool {
        matches!(self, Matcher::Path(p) if path_match(p, path))
    }

    /// The argument it matched, described, or `None`.
    fn argument(&self, arguments: &Value) -> Option<String> {
        let Matcher::Argument { key, glob } = self else { return None };
        let value = match arguments.get(key)? {
            Value::String(s) => s.clone(),
            Value::Null | Value::Array(_) | Value::Object(_) => return None,
            other => other.to_string(),
        };
        glob_match(glob, &value).then(|| format!("argument `{key}` is `{}`", shorten(&value)))
    }
}

fn shorten(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A call's subjects, with command lines split once.
struct CallView {
    /// Each simple command, as written.
    commands: Vec<Vec<String>>,
    /// Why a command line could not be judged command by command.
    opaque: Option<&'static str>,
    paths: Vec<String>,
}

impl CallView {
    fn new(subjects: &[Subject]) -> CallView {
        let mut view = CallView { commands: Vec::new(), opaque: None, paths: Vec::new() };
        for subject in subjects {
            match subject {
                Subject::Command(line) => {
                    let line = shellwords::split(line);
                    view.opaque = view.opaque.or(line.opaque);
                    view.commands.extend(line.commands);
                }
                Subject::Argv(argv) => {
                    view.opaque = view.opaque.or(shellwords::hidden_inside(argv));
                    view.commands.push(argv.clone());
                }
                Subject::Path(path) => view.paths.push(path.clone()),
            }
        }
        view
    }

    /// What of the call `matcher` finds, looking under wrappers too (for deny and ask).
    fn found_by(&self, matcher: &Matcher, arguments: &Value) -> Option<String> {
        if let Some(found) = matcher.argument(arguments) {
            return Some(found);
        }
        for command in &self.commands {
            if matcher.command(command) {
                return Some(format!("command `{}`", shorten(&command.join(" "))));
            }
            if let Some(inner) =
                shellwords::inner_commands(command).into_iter().find(|c| matcher.command(c))
            {
                return Some(format!(
                    "command `{}`, which runs `{}`",
                    shorten(&command.join(" ")),
                    shorten(&inner.join(" "))
                ));
            }
        }
        self.paths.iter().find(|p| matcher.path(p)).map(|p| format!("path `{p}`"))
    }
}

impl CallRules {
    /// Whether the provider's subjects of the call are needed to judge it.
    pub(crate) fn needs_subjects(&self) -> bool {
        self.kind.is_some()
    }

    /// Judges one call of `tool` with `arguments`, acting on `subjects` (as its provider
    /// tells them; an `Err` when it could not): [`Permission::Allow`], `Deny` or `Ask`.
    pub fn judge(
        &self,
        tool: &str,
        arguments: &Value,
        subjects: Result<Vec<Subject>, String>,
    ) -> Permission {
        let subjects = match subjects {
            Ok(subjects) => subjects,
            Err(e) => {
                return Permission::Deny(format!(
                    "the permission rules on its calls could not be checked: {e}"
                ));
            }
        };
        let view = CallView::new(&subjects);
        for rule in &self.deny {
            if let Some(found) = view.found_by(&rule.matcher, arguments) {
                return Permission::Deny(format!(
                    "denied by rule `permissions.deny: {}` ({found}); remove the rule to allow it",
                    rule.rule
                ));
            }
        }
        // A program named by an expansion, or commands a shell reads from elsewhere, could
        // be what a deny or ask rule names: no rule may let them through unseen.
        if shellwords::hides_commands(view.opaque)
            && (!self.deny.is_empty() || !self.ask.is_empty())
        {
            return Permission::Ask(format!(
                "a command line with {} (which `permissions.deny` and `permissions.ask` rules \
                 cannot see through)",
                view.opaque.unwrap_or_default()
            ));
        }
        if let Some(asked) = &self.asked {
            return Permission::Ask(asked.clone());
        }
        for rule in &self.ask {
            if let Some(found) = view.found_by(&rule.matcher, arguments) {
                return Permission::Ask(format!("rule `permissions.ask: {}` ({found})", rule.rule));
            }
        }
        if self.allowed
            || self
                .allow
                .iter()
                .any(|r| r.matcher.everything() || r.matcher.argument(arguments).is_some())
        {
            return Permission::Allow;
        }
        if let Some(why) = view.opaque {
            return Permission::Ask(format!(
                "a command line with {why} (which `permissions.allow` rules cannot judge)"
            ));
        }
        let mut covered_any = false;
        for command in &view.commands {
            // A rule on a command covers what the command does, not a file the shell
            // writes for it (`ls > notes.txt` skips the file tools' read-first check): a
            // redirection needs a rule that names one.
            let uncovered = shellwords::file_redirections(command).find(|&(at, operator, _)| {
                !self
                    .allow
                    .iter()
                    .any(|r| r.matcher.command(command) && r.matcher.redirects(at, operator))
            });
            if let Some((at, operator, target)) = uncovered
                && self.allow.iter().any(|r| r.matcher.command(command))
            {
                // The rule that would cover it has the operator at the same place.
                return Permission::Ask(format!(
                    "command `{}` writes `{}` by a redirection (`{operator}`), which a rule on \
                     the command does not cover; an allow rule naming the redirection \
                     (`{tool}({} {operator} *)`) would",
                    shorten(&command.join(" ")),
                    shorten(target),
                    shorten(&command[..at].join(" ")),
                ));
            }
            if !self.allow.iter().any(|r| r.matcher.command(command)) {
                let program = command.first().map_or("", String::as_str);
                return Permission::Deny(format!(
                    "command `{}` is not matched by any `permissions.allow` rule; add one such \
                     as `{tool}({program} *)` to allow it",
                    shorten(&command.join(" "))
                ));
            }
            covered_any = true;
        }
        for path in &view.paths {
            if !self.allow.iter().any(|r| r.matcher.path(path)) {
                return Permission::Deny(format!(
                    "path `{path}` is not matched by any `permissions.allow` rule; add one such \
                     as `{tool}({path})` to allow it"
                ));
            }
            covered_any = true;
        }
        if covered_any || (self.kind == Some(SubjectKind::Command) && subjects.is_empty()) {
            return Permission::Allow;
        }
        Permission::Deny(
            "not matched by any `permissions.allow` rule; add one to allow it".to_owned(),
        )
    }
}

impl PermissionRules {
    /// Whether there are no rules at all (everything is allowed).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty() && self.ask.is_empty()
    }

    /// Adds a deny glob.
    pub fn deny(mut self, glob: &str) -> Self {
        self.deny.push(glob.to_owned());
        self
    }

    /// Adds an allow glob.
    pub fn allow(mut self, glob: &str) -> Self {
        self.allow.push(glob.to_owned());
        self
    }

    /// Adds an ask glob.
    pub fn ask(mut self, glob: &str) -> Self {
        self.ask.push(glob.to_owned());
        self
    }

    /// The first rule that is neither a glob nor a known selector, or a rule on calls that
    /// is not well formed, with what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let lists = [("allow", &self.allow), ("deny", &self.deny), ("ask", &self.ask)];
        for (list, rules) in lists {
            let mut tools = Vec::with_capacity(rules.len());
            for rule in rules {
                let (names, spec) =
                    split_rule(rule).map_err(|e| format!("permissions.{list}: {e}"))?;
                if let Some(spec) = spec
                    && shellwords::split(spec).commands.len() > 1
                {
                    return Err(format!(
                        "permissions.{list}: rule `{rule}` names more than one command; write \
                         one rule per command (a line of several commands is allowed when each \
                         of its commands is)"
                    ));
                }
                tools.push(names.to_owned());
            }
            check_selectors(&tools).map_err(|e| format!("permissions.{list}: {e}"))?;
        }
        Ok(())
    }

    /// The rules on calls (`TOOL(WHAT)`) of every list.
    pub fn call_rules(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let lists = [("allow", &self.allow), ("deny", &self.deny), ("ask", &self.ask)];
        lists.into_iter().flat_map(|(list, rules)| {
            rules.iter().filter(|r| r.contains('(')).map(move |r| (list, r.as_str()))
        })
    }

    /// Whether the rule on calls `rule` (see [`PermissionRules::call_rules`]) can match a
    /// call of `tool`, whose calls act on `kind`: `Some(false)` when it names the tool but
    /// cannot read the tool's calls (a command pattern for a tool that runs none).
    pub fn reads_calls_of(
        rule: &str,
        tool: &str,
        annotations: &ToolAnnotations,
        kind: Option<SubjectKind>,
    ) -> Option<bool> {
        let (names, Some(spec)) = split_rule(rule).ok()? else { return None };
        rule_matches(names, tool, annotations).then(|| Matcher::new(spec, kind).is_some())
    }

    /// Decides for one tool, by its full name and what its annotations (as configuration
    /// has them) say it is, for a tool whose calls act on nothing rules can name.
    pub fn decide(&self, tool: &str, annotations: &ToolAnnotations) -> Permission {
        self.decide_for(tool, annotations, None)
    }

    /// Decides for one tool, by its full name, what its annotations (as configuration has
    /// them) say it is and what its calls act on. The result depends only on those, so the
    /// registry computes it once per tool; when rules on calls apply it is
    /// [`Permission::Check`], judged per call.
    pub fn decide_for(
        &self,
        tool: &str,
        annotations: &ToolAnnotations,
        kind: Option<SubjectKind>,
    ) -> Permission {
        let mut call = CallRules { kind, ..CallRules::default() };
        // Sorts each rule naming the tool: a plain rule decides, a rule on calls is kept.
        let sort = |rules: &[String], kept: &mut Vec<CallRule>| -> Option<String> {
            let mut plain = None;
            for rule in rules {
                let Ok((names, spec)) = split_rule(rule) else { continue };
                if !rule_matches(names, tool, annotations) {
                    continue;
                }
                match spec {
                    None => {
                        plain.get_or_insert_with(|| rule.clone());
                    }
                    Some(spec) => {
                        if let Some(matcher) = Matcher::new(spec, kind) {
                            kept.push(CallRule { rule: rule.clone(), matcher });
                        }
                    }
                }
            }
            plain
        };
        let mut deny = Vec::new();
        if let Some(rule) = sort(&self.deny, &mut deny) {
            return Permission::Deny(format!(
                "denied by rule `permissions.deny: {rule}`; remove the rule to allow it"
            ));
        }
        call.deny = deny;
        let mut ask = Vec::new();
        call.asked =
            sort(&self.ask, &mut ask).map(|rule| format!("rule `permissions.ask: {rule}`"));
        call.ask = ask;
        let mut allow = Vec::new();
        call.allowed = sort(&self.allow, &mut allow).is_some() || self.allow.is_empty();
        call.allow = allow;
        if call.deny.is_empty() {
            if let Some(asked) = call.asked {
                return Permission::Ask(asked);
            }
            if call.ask.is_empty() && (call.allowed || call.allow.is_empty()) {
                return if call.allowed {
                    Permission::Allow
                } else {
                    Permission::Deny(
                        "not matched by any `permissions.allow` rule; add one to allow it"
                            .to_owned(),
                    )
                };
            }
        }
        Permission::Check(Arc::new(call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn any() -> ToolAnnotations {
        ToolAnnotations::default()
    }

    #[test]
    fn deny_wins() {
        let rules = PermissionRules::default().allow("fs__*").ask("fs__write").deny("fs__bash");
        assert_eq!(rules.decide("fs__read", &any()), Permission::Allow);
        expect![[
            r#"Deny("denied by rule `permissions.deny: fs__bash`; remove the rule to allow it")"#
        ]]
        .assert_eq(&format!("{:?}", rules.decide("fs__bash", &any())));
        expect![[r#"Ask("rule `permissions.ask: fs__write`")"#]]
            .assert_eq(&format!("{:?}", rules.decide("fs__write", &any())));
        expect![[r#"Deny("not matched by any `permissions.allow` rule; add one to allow it")"#]]
            .assert_eq(&format!("{:?}", rules.decide("github__x", &any())));
    }

    fn judge_command(rules: &PermissionRules, tool: &str, line: &str) -> Permission {
        match rules.decide_for(tool, &any(), Some(SubjectKind::Command)) {
            Permission::Check(call) => {
                call.judge(tool, &Value::Null, Ok(vec![Subject::Command(line.to_owned())]))
            }
            decided => decided,
        }
    }

    fn verdict(p: &Permission) -> &'static str {
        match p {
            Permission::Allow => "allow",
            Permission::Deny(_) => "deny",
            Permission::Ask(_) => "ask",
            Permission::Check(_) => "check",
        }
    }

    /// Rules on commands: every command of a line must be allowed, any denied one (also
    /// under a wrapper) denies the line, and a line that cannot be split needs approval.
    #[test]
    fn rules_on_commands() {
        let rules = PermissionRules::default()
            .allow("fs__read")
            .allow("fs__bash(git status)")
            .allow("fs__bash(git diff *)")
            .allow("fs__bash(npm run test:*)")
            .allow("fs__bash(ls)")
            .deny("fs__bash(rm *)")
            .ask("fs__bash(git push *)");
        assert!(rules.check().is_ok());
        for (line, want) in [
            ("git status", "allow"),
            ("git  status", "allow"),
            ("git status --short", "deny"),
            ("git diff", "allow"),
            ("git diff HEAD~1 -- src", "allow"),
            ("git status && git diff --stat | ls", "allow"),
            ("git status; curl x", "deny"),
            ("npm run test", "allow"),
            ("npm run test --watch", "allow"),
            ("npm run testing", "deny"),
            ("rm -rf target", "deny"),
            ("git status && rm -rf /", "deny"),
            ("sudo rm -rf /", "deny"),
            ("bash -c 'git status; rm x'", "deny"),
            ("/bin/rm x", "deny"),
            ("FOO=1 git status", "deny"),
            ("git push origin main", "ask"),
            ("git status $(rm x)", "deny"),
            ("git diff $(cat list)", "ask"),
            ("echo `date`", "ask"),
            ("ls 'a b'", "deny"),
            ("ls", "allow"),
            ("ls\u{a0}x", "ask"),
            ("ls\u{2003}x", "ask"),
            ("ls\u{b}touch", "ask"),
            ("ls\r", "ask"),
            ("ls\tx", "deny"),
        ] {
            let p = judge_command(&rules, "fs__bash", line);
            assert_eq!(verdict(&p), want, "{line}: {p:?}");
        }
        expect![[r#"Deny("denied by rule `permissions.deny: fs__bash(rm *)` (command `sudo rm -rf /`, which runs `rm -rf /`); remove the rule to allow it")"#]]
            .assert_eq(&format!("{:?}", judge_command(&rules, "fs__bash", "sudo rm -rf /")));
        expect![[r#"Deny("command `curl x` is not matched by any `permissions.allow` rule; add one such as `fs__bash(curl *)` to allow it")"#]]
            .assert_eq(&format!("{:?}", judge_command(&rules, "fs__bash", "git status; curl x")));
        expect![[r#"Ask("a command line with a command substitution (which `permissions.allow` rules cannot judge)")"#]]
            .assert_eq(&format!("{:?}", judge_command(&rules, "fs__bash", "echo `date`")));
        // A rule on a command does not cover a file it writes by a redirection.
        let reads = PermissionRules::default()
            .allow("fs__bash(ls *)")
            .allow("fs__bash(cat *)")
            .allow("fs__bash(echo > *)");
        for (line, want) in [
            ("cat /dev/null > keep.txt", "ask"),
            ("ls > keep.txt", "ask"),
            ("ls >> log.txt", "ask"),
            ("ls >| keep.txt", "ask"),
            ("ls &> keep.txt", "ask"),
            ("ls 2> err.txt", "ask"),
            ("ls>keep.txt", "ask"),
            ("ls >& keep.txt", "ask"),
            ("ls >&2keep.txt", "ask"),
            ("ls >1 /dev/null", "ask"),
            ("ls >- /dev/null", "ask"),
            ("ls 2>1", "ask"),
            ("ls >&1x", "ask"),
            ("cat <> keep.txt", "ask"),
            ("ls && cat x > keep.txt", "ask"),
            ("ls 2>&1", "allow"),
            ("ls >&2", "allow"),
            ("ls >&2;ls 2>&1|cat", "allow"),
            ("ls >&-", "allow"),
            ("ls 3>&1-", "allow"),
            ("ls >&2- /dev/null", "allow"),
            ("ls > /dev/null", "allow"),
            ("ls 2>/dev/null", "allow"),
            ("cat < in.txt", "allow"),
            ("ls | cat", "allow"),
            ("echo > x.txt", "allow"),
            ("rm x > y", "deny"),
        ] {
            let p = judge_command(&reads, "fs__bash", line);
            assert_eq!(verdict(&p), want, "{line}: {p:?}");
        }
        // Only a rule with the same operator at the same place, followed by a target that
        // is not /dev/null, covers a file redirection.
        let named = PermissionRules::default()
            .allow("fs__bash(cargo test 2>&1 *)")
            .allow("fs__bash(make 2>/dev/null *)")
            .allow("fs__bash(ls > *)")
            .allow("fs__bash(cat x >> log.txt)")
            .allow("fs__bash(echo * > /dev/null)");
        for (line, want) in [
            ("cargo test 2>&1 > Cargo.toml", "ask"),
            ("cargo test 2>&1 >> Cargo.toml", "ask"),
            ("cargo test 2>&1 -q", "allow"),
            ("make 2>/dev/null > Makefile", "ask"),
            ("make 2>/dev/null 2> Makefile", "ask"),
            ("make 2>/dev/null all", "allow"),
            ("ls > out.txt", "allow"),
            ("ls > out.txt 2> err.txt", "ask"),
            ("ls 2> err.txt", "deny"),
            ("cat x >> log.txt", "allow"),
            ("echo hi > /dev/null", "allow"),
        ] {
            let p = judge_command(&named, "fs__bash", line);
            assert_eq!(verdict(&p), want, "{line}: {p:?}");
        }
        expect![[r#"Ask("command `cargo test 2>&1 > Cargo.toml` writes `Cargo.toml` by a redirection (`>`), which a rule on the command does not cover; an allow rule naming the redirection (`fs__bash(cargo test 2>&1 > *)`) would")"#]].assert_eq(&format!(
            "{:?}",
            judge_command(&named, "fs__bash", "cargo test 2>&1 > Cargo.toml")
        ));
        expect![[r#"Ask("command `ls > keep.txt` writes `keep.txt` by a redirection (`>`), which a rule on the command does not cover; an allow rule naming the redirection (`fs__bash(ls > *)`) would")"#]]
            .assert_eq(&format!("{:?}", judge_command(&reads, "fs__bash", "ls > keep.txt")));
        // A program named `ls x` with a no-break space is not `ls x`: no hint of a rule.
        let allows_ls = PermissionRules::default().allow("fs__bash(ls *)");
        expect![[r#"Ask("a command line with a space or control character that bash does not split words at (only spaces and tabs) (which `permissions.allow` rules cannot judge)")"#]]
            .assert_eq(&format!("{:?}", judge_command(&allows_ls, "fs__bash", "ls\u{a0}x")));
        // The plain rules of other tools are untouched, and a plain allow covers every call.
        assert_eq!(rules.decide("fs__read", &any()), Permission::Allow);
        let open = PermissionRules::default().deny("fs__bash(rm *)");
        assert_eq!(verdict(&judge_command(&open, "fs__bash", "echo $(date)")), "allow");
        assert_eq!(verdict(&judge_command(&open, "fs__bash", "echo $(rm x)")), "deny");
        let everything = PermissionRules::default().allow("fs__bash(*)");
        assert_eq!(verdict(&judge_command(&everything, "fs__bash", "a $(b) | c")), "allow");
        // A program named by an expansion could be the denied one: asked, whatever allows.
        let guarded = PermissionRules::default().allow("fs__bash(*)").deny("fs__bash(rm *)");
        for line in ["X=rm; $X -rf x", "${X} -rf x", r"$'\x72m' -rf x", "sudo $X y"] {
            assert_eq!(verdict(&judge_command(&guarded, "fs__bash", line)), "ask", "{line}");
        }
        assert_eq!(verdict(&judge_command(&guarded, "fs__bash", "env -S 'rm x'")), "deny");
        // Nor a substituted program, nor a shell reading its input; wrapped or deferred
        // commands are found.
        let touchy = PermissionRules::default().deny("fs__bash(touch *)");
        for line in [
            "$(echo touch) f1",
            "bash -c \"$(echo touch) f\"",
            "bash -c \"`echo touch` f\"",
            "echo 'touch f' | bash",
        ] {
            assert_eq!(verdict(&judge_command(&touchy, "fs__bash", line)), "ask", "{line}");
        }
        for line in [
            "trap 'touch f' EXIT",
            "coproc touch f; wait",
            "time -p touch f",
            "bash <<< 'touch f'",
            "flock /tmp/l touch f",
            "taskset 1 touch f",
            "chrt -o 0 touch f",
            "strace -o /dev/null touch f",
        ] {
            assert_eq!(verdict(&judge_command(&touchy, "fs__bash", line)), "deny", "{line}");
        }
        assert_eq!(verdict(&judge_command(&touchy, "fs__bash", "bash build.sh")), "allow");
        // Stacked wrappers do not hide a denied or asked command: it is found a few
        // wrappers down, and asked about when it is further down than is looked.
        let stacked = PermissionRules::default()
            .allow("fs__bash(*)")
            .deny("fs__bash(rm *)")
            .ask("fs__bash(git push *)");
        // So do a command given as its words (`fs__exec`).
        let exec = PermissionRules::default().allow("fs__exec(*)").deny("fs__exec(rm *)");
        let argv = |words: String| {
            let argv = words.split(' ').map(str::to_owned).collect();
            match exec.decide_for("fs__exec", &any(), Some(SubjectKind::Command)) {
                Permission::Check(call) => {
                    verdict(&call.judge("fs__exec", &Value::Null, Ok(vec![Subject::Argv(argv)])))
                }
                decided => verdict(&decided),
            }
        };
        assert_eq!(argv(format!("{}rm -rf x", "env ".repeat(50))), "ask");
        assert_eq!(argv("env env rm -rf x".to_owned()), "deny");
        assert_eq!(argv("env env ls".to_owned()), "allow");
        for (line, want) in [
            ("env env env env env env rm -rf x", "deny"),
            ("command command command command command command rm -rf x", "deny"),
            ("sudo sudo sudo sudo sudo sudo rm -rf x", "deny"),
            ("nice nice nice nice nice nice git push origin", "ask"),
            (&format!("{}rm -rf x", "env ".repeat(50)), "ask"),
            (&format!("{}git push origin", "nice ".repeat(50)), "ask"),
            (&format!("{}ls", "env ".repeat(50)), "ask"),
            ("env env env env env env ls", "allow"),
            // A wrapper's options with a value, however given, and `--` before its
            // positional arguments do not hide the command it runs; nor does an option
            // not known to take one.
            ("sudo --user root rm -rf x", "deny"),
            ("sudo -iu root rm -rf x", "deny"),
            ("xargs --max-args 1 rm", "deny"),
            ("stdbuf --output L rm x", "deny"),
            ("timeout -- 5 rm -rf x", "deny"),
            ("sudo --frobnicate root rm -rf x", "deny"),
            ("sudo --preserve-env ls", "allow"),
        ] {
            assert_eq!(verdict(&judge_command(&stacked, "fs__bash", line)), want, "{line}");
        }
        assert_eq!(verdict(&judge_command(&guarded, "fs__bash", "echo $X")), "allow");
        assert_eq!(verdict(&judge_command(&everything, "fs__bash", "$X -rf x")), "allow");
        // A plain deny decides without looking at calls.
        let denied = PermissionRules::default().deny("fs__bash").allow("fs__bash(ls)");
        assert_eq!(
            verdict(&denied.decide_for("fs__bash", &any(), Some(SubjectKind::Command))),
            "deny"
        );
    }

    #[test]
    fn rules_on_paths_and_arguments() {
        let rules = PermissionRules::default()
            .allow("fs__write(src/**)")
            .allow("fs__write(docs/*.md)")
            .deny("fs__write(**/.env)")
            .allow("api__*(owner=acme)");
        let judge = |tool: &str, subjects: Vec<Subject>, args: Value, kind| match rules.decide_for(
            tool,
            &any(),
            kind,
        ) {
            Permission::Check(call) => call.judge(tool, &args, Ok(subjects)),
            decided => decided,
        };
        let path = |p: &str| vec![Subject::Path(p.to_owned())];
        let kind = Some(SubjectKind::Path);
        assert_eq!(verdict(&judge("fs__write", path("src/a/b.rs"), Value::Null, kind)), "allow");
        assert_eq!(verdict(&judge("fs__write", path("docs/x.md"), Value::Null, kind)), "allow");
        assert_eq!(verdict(&judge("fs__write", path("docs/sub/x.md"), Value::Null, kind)), "deny");
        assert_eq!(verdict(&judge("fs__write", path("src/.env"), Value::Null, kind)), "deny");
        assert_eq!(verdict(&judge("fs__write", path("README.md"), Value::Null, kind)), "deny");
        let acme = serde_json::json!({"owner": "acme", "repo": "x"});
        let other = serde_json::json!({"owner": "evil"});
        assert_eq!(verdict(&judge("api__get_repo", vec![], acme, None)), "allow");
        assert_eq!(verdict(&judge("api__get_repo", vec![], other, None)), "deny");
        // Subjects the provider could not tell refuse the call, saying why.
        let Permission::Check(call) = rules.decide_for("fs__write", &any(), kind) else {
            panic!("rules on calls apply")
        };
        expect![[r#"Deny("the permission rules on its calls could not be checked: path `../x` is outside the workspace")"#]]
            .assert_eq(&format!("{:?}", call.judge("fs__write", &Value::Null, Err("path `../x` is outside the workspace".into()))));
        // A command pattern cannot read the calls of a tool that runs none.
        assert_eq!(
            PermissionRules::reads_calls_of("api__*(git *)", "api__x", &any(), None),
            Some(false)
        );
        assert_eq!(
            PermissionRules::reads_calls_of("api__*(a=b)", "api__x", &any(), None),
            Some(true)
        );
        assert_eq!(PermissionRules::reads_calls_of("fs__*(git *)", "api__x", &any(), None), None);
    }

    #[test]
    fn malformed_rules_on_calls_are_refused() {
        for (rule, want) in [
            (
                "fs__bash(git *",
                "permissions.deny: rule `fs__bash(git *` does not end with `)`; a rule on calls is written `TOOL(WHAT)`, as in `fs__bash(git *)`",
            ),
            (
                "(git *)",
                "permissions.deny: rule `(git *)` names no tool before `(`; write `*(git *)` for all",
            ),
            (
                "fs__bash()",
                "permissions.deny: rule `fs__bash()` has nothing between its parentheses; name a command, a path or `argument=glob`, or leave the parentheses off to match every call",
            ),
            (
                "fs__bash(git a && rm b)",
                "permissions.deny: rule `fs__bash(git a && rm b)` names more than one command; write one rule per command (a line of several commands is allowed when each of its commands is)",
            ),
            (
                "@writ(src/**)",
                "permissions.deny: unknown selector `@writ`; the selectors are @readOnly, @destructive, @openWorld, @read, @write, @execute, @network",
            ),
        ] {
            assert_eq!(PermissionRules::default().deny(rule).check().unwrap_err(), want);
        }
        assert!(PermissionRules::default().deny("@write(src/**)").check().is_ok());
    }

    #[test]
    fn no_allow_rules_allow_everything() {
        let rules = PermissionRules::default().deny("*__delete*");
        assert_eq!(rules.decide("github__search", &any()), Permission::Allow);
        assert!(matches!(rules.decide("github__delete_repo", &any()), Permission::Deny(_)));
    }

    /// Selectors match what a tool is, whoever provides it: a class when the provider gives
    /// one, else the annotations.
    #[test]
    fn selectors_match_what_tools_are() {
        let class = |c| ToolAnnotations { permission: Some(c), ..ToolAnnotations::read_only() };
        let reader = ToolAnnotations::read_only();
        let mcp = ToolAnnotations::default(); // not read-only, open world, no class
        let destroyer = ToolAnnotations { destructive: true, open_world: false, ..any() };
        let cases: &[(&str, &ToolAnnotations, bool)] = &[
            ("@readOnly", &reader, true),
            ("@readOnly", &mcp, false),
            ("@read", &reader, true),
            ("@read", &class(PermissionClass::Execute), false),
            ("@write", &mcp, true),
            ("@write", &reader, false),
            ("@write", &class(PermissionClass::Write), true),
            ("@execute", &class(PermissionClass::Execute), true),
            ("@execute", &mcp, false),
            ("@network", &mcp, true),
            ("@network", &class(PermissionClass::Network), true),
            ("@network", &class(PermissionClass::Read), false),
            ("@destructive", &destroyer, true),
            ("@destructive", &mcp, false),
            ("@openWorld", &mcp, true),
            ("@openWorld", &destroyer, false),
        ];
        for (rule, annotations, matched) in cases {
            let rules = PermissionRules::default().deny(rule);
            let denied = matches!(rules.decide("x__y", annotations), Permission::Deny(_));
            assert_eq!(denied, *matched, "{rule} on {annotations:?}");
        }
        let rules = PermissionRules::default().allow("@read").ask("@write");
        assert_eq!(rules.decide("a__b", &reader), Permission::Allow);
        assert_eq!(
            rules.decide("a__c", &mcp),
            Permission::Ask("rule `permissions.ask: @write`".into())
        );
        assert!(rules.check().is_ok());
        expect!["permissions.ask: unknown selector `@writes`; the selectors are @readOnly, @destructive, @openWorld, @read, @write, @execute, @network"]
            .assert_eq(&PermissionRules::default().ask("@writes").check().unwrap_err());
    }
}
