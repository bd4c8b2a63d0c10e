//! Command lines as permission rules see them: split into simple commands at `&&`, `||`,
//! `;`, `|`, `&`, parentheses and line breaks, and each command into words with the
//! shell's quoting removed.
//!
//! This is not a shell. It finds what a line runs well enough to judge it against rules,
//! and says when it cannot: a command substitution (`$(…)`, backquotes), a process
//! substitution, a here-document or an unclosed quote makes the line *opaque*: its
//! commands are then a best effort (split at the substitutions too), good for finding a
//! denied command, never enough to allow one.

/// Why a line is opaque when a command's program is named by an expansion: unlike a
/// substitution, whose commands are split out for deny rules to find, what runs then is
/// unknown to every rule.
pub(crate) const NAMED_BY_EXPANSION: &str = "a command named by an expansion";

/// Why a line is opaque when a shell reads its commands from its input (`echo 'rm x' |
/// bash`, `bash <<EOF`): what runs is not among the line's commands. (A here-string's
/// line, `bash <<< 'rm x'`, is split and judged as `-c`'s is; a script file a shell is
/// given is no more on the line than what `make` or `npm test` runs.)
pub(crate) const SHELL_READS_COMMANDS: &str = "a shell that reads its commands from its input";

/// Why a line is opaque when it holds, outside quotes, a space bash does not split words
/// at (a no-break space, an em space) or a control character other than a tab or a line
/// break.
pub(crate) const ODD_SPACE: &str =
    "a space or control character that bash does not split words at (only spaces and tabs)";

/// Why a line is opaque when a command runs under more wrappers or lines within lines
/// than are looked through (`env env … env rm x`): what runs at the bottom is not seen.
pub(crate) const WRAPPED_TOO_DEEP: &str = "commands under more wrappers than are looked through";

/// How many wrappers (`env`, `sudo`, `nice`, leading assignments, …) are looked through
/// for the command they run. Each takes words off the front and splits nothing, so the
/// limit only bounds the work on absurd lines.
const MAX_WRAPPERS: usize = 32;

/// How many lines within lines (`bash -c`, `eval`, `su -c`, …) are looked through. Each
/// splits its line again, so this limit is small.
const MAX_LINES: usize = 5;

/// Whether a line opaque for `why` hides what it runs from deny and ask rules too, not
/// only from allow rules.
pub(crate) fn hides_commands(why: Option<&str>) -> bool {
    matches!(why, Some(w) if w == NAMED_BY_EXPANSION || w == SHELL_READS_COMMANDS || w == WRAPPED_TOO_DEEP)
}

/// One line, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    /// The simple commands, each its words, in order.
    pub commands: Vec<Vec<String>>,
    /// Why the line cannot be judged command by command, when it cannot.
    pub opaque: Option<&'static str>,
}

/// Splits `line` into simple commands.
pub(crate) fn split(line: &str) -> Line {
    // Lines within lines (`bash -c "eval 'sh -c …'"`) are split again for each look at
    // them: past a few levels, the line is opaque instead of taking exponential time.
    thread_local!(static DEPTH: std::cell::Cell<u8> = const { std::cell::Cell::new(0) });
    let depth = DEPTH.with(|d| d.replace(d.get() + 1));
    let line = if depth >= 6 {
        Line { commands: Vec::new(), opaque: Some(NAMED_BY_EXPANSION) }
    } else {
        split_words(line)
    };
    DEPTH.with(|d| d.set(depth));
    line
}

fn split_words(line: &str) -> Line {
    let mut s = Splitter::default();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\\' => {
                match next {
                    Some('\n') => {}
                    Some(n) => s.push(n),
                    None => s.push('\\'),
                }
                i += 2;
                continue;
            }
            '\'' => match chars[i + 1..].iter().position(|&q| q == '\'') {
                Some(end) => {
                    s.started = true;
                    s.word.extend(&chars[i + 1..i + 1 + end]);
                    i += end + 2;
                    continue;
                }
                None => {
                    s.opaque("an unclosed quote");
                    s.word.extend(&chars[i + 1..]);
                    s.started = true;
                    break;
                }
            },
            '"' => {
                let at_program = s.at_program();
                s.started = true;
                let mut j = i + 1;
                let mut closed = false;
                while j < chars.len() {
                    match chars[j] {
                        '"' => {
                            closed = true;
                            break;
                        }
                        '\\' if matches!(chars.get(j + 1), Some('"' | '\\' | '$' | '`')) => {
                            s.word.push(chars[j + 1]);
                            j += 2;
                            continue;
                        }
                        '$' if chars.get(j + 1) == Some(&'(') => {
                            s.opaque("a command substitution");
                            s.program_substituted |= at_program;
                        }
                        '`' => {
                            s.opaque("a command substitution");
                            s.program_substituted |= at_program;
                        }
                        _ => {}
                    }
                    s.word.push(chars[j]);
                    j += 1;
                }
                if !closed {
                    s.opaque("an unclosed quote");
                }
                i = j + 1;
                continue;
            }
            '#' if !s.started => {
                // A comment, to the end of the line.
                match chars[i..].iter().position(|&n| n == '\n') {
                    Some(end) => i += end,
                    None => break,
                }
                continue;
            }
            ' ' | '\t' => s.end_word(),
            '\n' | ';' => s.end_command(),
            '&' if next == Some('>') => {
                // `&>file`: both streams to a file.
                s.end_word();
                i = s.redirection(&chars, i);
                continue;
            }
            '&' | '|' => {
                s.end_command();
                if next == Some(c) || (c == '|' && next == Some('&')) {
                    i += 1;
                }
            }
            '(' | ')' => s.end_command(),
            '$' if next == Some('(') => {
                s.opaque("a command substitution");
                // `$(echo rm) x`: the program is what the substitution prints.
                s.program_substituted |= s.at_program();
                s.end_command();
                i += 2;
                continue;
            }
            '`' => {
                s.opaque("a command substitution");
                if !s.in_backquotes {
                    s.program_substituted |= s.at_program();
                }
                s.in_backquotes = !s.in_backquotes;
                s.end_command();
            }
            '<' | '>' if next == Some('(') => {
                s.opaque("a process substitution");
                s.end_command();
                i += 2;
                continue;
            }
            '<' if next == Some('<') && chars.get(i + 2) != Some(&'<') => {
                s.opaque("a here-document");
                s.end_word();
                i = s.redirection(&chars, i);
                continue;
            }
            '<' | '>' => {
                // A file descriptor number right before belongs to the operator (`2>&1`).
                let fd = s.started && s.word.chars().all(|d| d.is_ascii_digit());
                let prefix = if fd { std::mem::take(&mut s.word) } else { String::new() };
                if !fd {
                    s.end_word();
                }
                s.started = false;
                s.word = prefix;
                i = s.redirection(&chars, i);
                continue;
            }
            // bash splits words at spaces and tabs only: `ls\u{a0}x` is one word, a program
            // that only looks like `ls x`, and a carriage return or a vertical tab is part of
            // a word too. Such a line is judged by no allow rule (nor shown in a hint as if
            // split).
            c if c != '\n' && c != '\t' && (c.is_whitespace() || c.is_control()) => {
                s.opaque(ODD_SPACE);
                s.push(c);
            }
            _ => s.push(c),
        }
        i += 1;
    }
    s.end_command();
    // A program named by an expansion (`$X -rf x`, `${X}`, `$'\x72m'`) could be anything:
    // no rule can judge it, whatever the words say.
    let expanded = |command: &Vec<String>| {
        let assignments = command.iter().take_while(|w| is_assignment(w)).count();
        command.get(assignments).is_some_and(|program| program.contains('$'))
    };
    // What each command runs besides itself, found once.
    let inners: Vec<Found> = s
        .commands
        .iter()
        .map(|c| {
            let mut found = Found::default();
            inner(c, (0, 0), &mut found);
            found
        })
        .collect();
    let inside = || inners.iter().flat_map(|f| &f.commands);
    if s.program_substituted || s.commands.iter().chain(inside()).any(expanded) {
        // Said over any other reason: deny rules cannot see through this one.
        s.opaque = Some(NAMED_BY_EXPANSION);
    } else if let Some(why) = inners.iter().find_map(|f| f.hidden) {
        s.opaque = Some(why);
    } else if s.commands.iter().chain(inside()).any(|c| reads_commands(c)) {
        s.opaque = Some(SHELL_READS_COMMANDS);
    }
    Line { commands: s.commands, opaque: s.opaque }
}

/// Whether `command` is a shell reading its commands from its input: given neither `-c`,
/// a here-string, nor a script file (nor `--version`).
fn reads_commands(command: &[String]) -> bool {
    let assignments = command.iter().take_while(|w| is_assignment(w)).count();
    let Some(program) = command.get(assignments) else { return false };
    let program = program.rsplit('/').next().unwrap_or(program);
    if !SHELLS.contains(&program) {
        return false;
    }
    let mut args = command[assignments + 1..].iter();
    while let Some(word) = args.next() {
        if is_redirection(word) {
            if word.ends_with("<<<") {
                return false;
            }
            // `< file`, `<< EOF`, `2> log`: the target is no argument.
            if !word.ends_with(|c: char| c.is_ascii_digit() || c == '-') {
                args.next();
            }
            continue;
        }
        let short = word.starts_with('-') && !word.starts_with("--");
        if (short && word.contains('c')) || matches!(word.as_str(), "--version" | "--help") {
            return false;
        }
        if !word.starts_with('-') && !word.starts_with('+') {
            // A script file.
            return false;
        }
    }
    true
}

/// The output redirections of `command` that write a file (`> f`, `>> f`, `>| f`, `&> f`,
/// `2> f`, `>& f`, `<> f`), as the operator's index, the operator and its target: neither a
/// duplication (`2>&1`, `>&2`, `>&-`) nor one to `/dev/null` is.
pub(crate) fn file_redirections(command: &[String]) -> impl Iterator<Item = (usize, &str, &str)> {
    command.iter().enumerate().filter_map(|(i, word)| {
        if !is_redirection(word) || !word.contains('>') || is_duplication(word) {
            return None;
        }
        let target = command.get(i + 1).map_or("", String::as_str);
        (target != "/dev/null").then_some((i, word.as_str(), target))
    })
}

/// Whether the redirection operator `word` duplicates or closes a descriptor (`2>&1`,
/// `>&2`, `<&-`) rather than naming a file.
pub(crate) fn is_duplication(word: &str) -> bool {
    word.rsplit_once('&')
        .is_some_and(|(before, after)| before.ends_with(['>', '<']) && !after.is_empty())
}

/// Whether `word` is a redirection operator as [`split`] keeps it (`>`, `2>&1`, `<<<`).
pub(crate) fn is_redirection(word: &str) -> bool {
    let operator = word.trim_start_matches(|c: char| c.is_ascii_digit());
    operator.starts_with(['<', '>', '&']) && operator.chars().all(|c| "<>&|-0123456789".contains(c))
}

/// Keywords that only start a compound command: `then rm x` runs `rm x`.
const COMPOUND_KEYWORDS: [&str; 10] =
    ["if", "then", "else", "elif", "do", "while", "until", "!", "{", "time"];

#[derive(Default)]
struct Splitter {
    commands: Vec<Vec<String>>,
    current: Vec<String>,
    word: String,
    /// Whether a word has begun (an empty quoted word is a word).
    started: bool,
    opaque: Option<&'static str>,
    /// A command's program is (or begins with) a command substitution's output.
    program_substituted: bool,
    /// Between an opening backquote and its closing one.
    in_backquotes: bool,
}

impl Splitter {
    fn push(&mut self, c: char) {
        self.word.push(c);
        self.started = true;
    }

    fn opaque(&mut self, why: &'static str) {
        self.opaque.get_or_insert(why);
    }

    /// Whether the word being read is the current command's program: nothing but variable
    /// assignments (and compound keywords) before it.
    fn at_program(&self) -> bool {
        self.current.iter().all(|w| {
            is_assignment(w) || COMPOUND_KEYWORDS.contains(&w.as_str()) || w.starts_with('-')
        }) && !self.word.contains('=')
    }

    fn end_word(&mut self) {
        if self.started || !self.word.is_empty() {
            self.current.push(std::mem::take(&mut self.word));
        }
        self.started = false;
    }

    fn end_command(&mut self) {
        self.end_word();
        let mut skip =
            self.current.iter().take_while(|w| COMPOUND_KEYWORDS.contains(&w.as_str())).count();
        // `time -p rm x` runs `rm x`: the keyword's options go with it.
        if self.current[..skip].iter().any(|w| w == "time") {
            skip += self.current[skip..].iter().take_while(|w| w.starts_with('-')).count();
        }
        let words: Vec<String> = self.current.drain(..).skip(skip).collect();
        if !words.is_empty() && !matches!(words[0].as_str(), "fi" | "done" | "esac" | "}") {
            self.commands.push(words);
        }
    }

    /// Reads a redirection operator starting at `i` (`>`, `>>`, `2>&1`, `&>`, `<<`, `<&-`)
    /// into one word of its own, with any file descriptor prefix already in `word`; returns
    /// where the line goes on.
    fn redirection(&mut self, chars: &[char], mut i: usize) -> usize {
        while i < chars.len() && matches!(chars[i], '<' | '>' | '&' | '|') {
            self.word.push(chars[i]);
            i += 1;
        }
        if self.word.ends_with("<<") && chars.get(i) == Some(&'-') {
            // `<<-EOF`: a here-document with its leading tabs removed.
            self.word.push('-');
            i += 1;
        } else if self.word.ends_with("<&") || self.word.ends_with(">&") {
            // `>&2`, `2>&1`, `<&3-`, `>&-` duplicate or close a descriptor only when the
            // digits (or `-`) make the whole word: bash reads `>&2keep.txt` as a write of
            // stdout and stderr to the file `2keep.txt`, whose name is then the next word.
            let digits = chars[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            let dash = usize::from(chars.get(i + digits) == Some(&'-'));
            let end = i + digits + dash;
            let ends_word = chars.get(end).is_none_or(|c| {
                matches!(c, ' ' | '\t' | '\n' | ';' | '&' | '|' | '<' | '>' | '(' | ')')
            });
            if end > i && ends_word {
                self.word.extend(&chars[i..end]);
                i = end;
            }
        }
        // Digits or `-` after any other operator are its target: `>1` writes a file `1`.
        self.started = true;
        self.end_word();
        i
    }
}

/// Programs that run another command given in their arguments, with the options of each
/// that take a value of their own and how many plain arguments come before the command.
/// An option not listed is read both with and without a value ([`wrapped_starts`]).
const WRAPPERS: &[(&str, &[&str], usize)] = &[
    (
        "sudo",
        &[
            "-u",
            "-g",
            "-U",
            "-C",
            "-D",
            "-h",
            "-p",
            "-r",
            "-t",
            "-T",
            "--user",
            "--group",
            "--other-user",
            "--close-from",
            "--chdir",
            "--host",
            "--prompt",
            "--role",
            "--type",
            "--command-timeout",
        ],
        0,
    ),
    ("doas", &["-u", "-C"], 0),
    ("env", &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"], 0),
    ("nice", &["-n", "--adjustment"], 0),
    (
        "ionice",
        &["-c", "-n", "-p", "-P", "-u", "--class", "--classdata", "--pid", "--pgid", "--uid"],
        0,
    ),
    ("timeout", &["-s", "-k", "--signal", "--kill-after"], 1),
    ("stdbuf", &["-i", "-o", "-e", "--input", "--output", "--error"], 0),
    (
        "xargs",
        &[
            "-a",
            "-d",
            "-E",
            "-I",
            "-L",
            "-n",
            "-P",
            "-s",
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--max-chars",
            "--process-slot-var",
        ],
        0,
    ),
    ("nohup", &[], 0),
    ("setsid", &[], 0),
    ("command", &[], 0),
    ("builtin", &[], 0),
    ("exec", &["-a"], 0),
    ("time", &["-f", "-o", "--format", "--output"], 0),
    ("watch", &["-n", "--interval"], 0),
    ("chroot", &[], 1),
    ("unbuffer", &[], 0),
    ("coproc", &[], 0),
    ("flock", &["-w", "--wait", "--timeout", "-E", "--conflict-exit-code", "-c", "--command"], 1),
    ("taskset", &[], 1),
    ("chrt", &["-T", "-P", "-D"], 1),
    ("strace", &["-o", "-e", "-s", "-p", "-u", "-E", "-a", "-O", "-S", "-P", "-I", "-b", "-X"], 0),
    ("ltrace", &["-o", "-e", "-s", "-p", "-u", "-n", "-a", "-A", "-l", "-x", "-L"], 0),
    ("nsenter", &["-t", "--target", "-S", "--setuid", "-G", "--setgid", "-w", "--wd"], 0),
    ("unshare", &["--map-user", "--map-group", "--propagation", "--setgroups"], 0),
    ("runuser", &["-u", "-g", "-G", "--user", "--group", "--supp-group"], 0),
    (
        "systemd-run",
        &[
            "-u",
            "--unit",
            "-p",
            "--property",
            "-E",
            "--setenv",
            "--uid",
            "--gid",
            "-M",
            "--machine",
        ],
        0,
    ),
    ("valgrind", &[], 0),
    ("catchsegv", &[], 0),
    (
        "xvfb-run",
        &[
            "-n",
            "-s",
            "-e",
            "-f",
            "-p",
            "--server-num",
            "--server-args",
            "--error-file",
            "--auth-file",
        ],
        0,
    ),
    ("firejail", &[], 0),
    ("proot", &["-r", "-b", "-w", "-q"], 0),
    ("faketime", &[], 1),
    ("caffeinate", &[], 0),
    ("busybox", &[], 0),
];

/// Programs whose option of this name takes a shell command line (`su -c 'rm x'`,
/// `flock -c 'rm x' lockfile`, `script -c 'rm x'`), as a shell's `-c` does.
const LINE_OPTIONS: &[(&str, &[&str])] = &[
    ("su", &["-c", "--command", "--session-command"]),
    ("runuser", &["-c", "--command", "--session-command"]),
    ("flock", &["-c", "--command"]),
    ("script", &["-c", "--command"]),
];

/// Shells whose `-c` argument is a command line of its own.
const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "ash", "fish"];

/// The commands `words` runs besides itself, as far as can be told: the command under a
/// wrapper (`sudo rm x` runs `rm x`), a shell's `-c` line, `eval`'s words, `find -exec`'s
/// command; the same under a path (`/bin/rm` is `rm`); and with leading variable
/// assignments left off. For deny rules, which must not be dodged by wrapping.
pub(crate) fn inner_commands(words: &[String]) -> Vec<Vec<String>> {
    let mut found = Found::default();
    inner(words, (0, 0), &mut found);
    found.commands
}

/// Why what `words` runs is hidden from deny and ask rules ([`hides_commands`]), when it
/// is: for a command given as its words (`fs__exec`'s argv), which no line split tells.
pub(crate) fn hidden_inside(words: &[String]) -> Option<&'static str> {
    let mut found = Found::default();
    inner(words, (0, 0), &mut found);
    found.hidden
}

/// What [`inner`] finds.
#[derive(Default)]
struct Found {
    commands: Vec<Vec<String>>,
    hidden: Option<&'static str>,
}

/// Adds what `words` runs to `found`, `depth` lines and wrappers down.
fn inner(words: &[String], depth: (usize, usize), found: &mut Found) {
    if words.is_empty() {
        return;
    }
    let (lines, wrappers) = depth;
    // A command run by this one, through a line of its own (`bash -c`) or not (`env`).
    let add_through = |found: &mut Found, command: Vec<String>, through_line: bool| {
        if command.is_empty() || found.commands.contains(&command) {
            return;
        }
        let depth = if through_line { (lines + 1, wrappers) } else { (lines, wrappers + 1) };
        // Past the limits, a command still to be unwrapped is not looked at: deny and ask
        // rules are told they cannot see it, rather than missing it unsaid.
        if depth.0 > MAX_LINES || depth.1 > MAX_WRAPPERS {
            found.hidden = found.hidden.or(Some(WRAPPED_TOO_DEEP));
            return;
        }
        found.commands.push(command.clone());
        inner(&command, depth, found);
    };
    let add = |found: &mut Found, command: Vec<String>| add_through(found, command, false);
    // A line run by the command: its commands, and whether it hides some.
    let add_line = |found: &mut Found, line: &str| {
        let line = split(line);
        if hides_commands(line.opaque) {
            found.hidden = found.hidden.or(line.opaque);
        }
        for command in line.commands {
            add_through(found, command, true);
        }
    };
    let assignments = words.iter().take_while(|w| is_assignment(w)).count();
    if assignments > 0 {
        add(found, words[assignments..].to_vec());
        return;
    }
    let program = words[0].rsplit('/').next().unwrap_or(&words[0]);
    if program != words[0] {
        let mut unpathed = words.to_vec();
        unpathed[0] = program.to_owned();
        add(found, unpathed);
    }
    if let Some((_, options)) = LINE_OPTIONS.iter().find(|o| o.0 == program) {
        let mut rest = words[1..].iter();
        while let Some(w) = rest.next() {
            let joined = options.iter().find_map(|o| w.strip_prefix(&format!("{o}=")));
            let line = match joined {
                Some(line) => Some(line),
                None if options.contains(&w.as_str()) => rest.next().map(String::as_str),
                None => None,
            };
            if let Some(line) = line {
                add_line(found, line);
            }
        }
    }
    if SHELLS.contains(&program)
        && let Some(at) = words.iter().position(|w| w.ends_with("<<<") && is_redirection(w))
        && let Some(line) = words.get(at + 1)
    {
        // `bash <<< 'rm x'` runs the here-string's line.
        add_line(found, line);
    }
    if SHELLS.contains(&program) {
        let mut rest = words[1..].iter();
        while let Some(w) = rest.next() {
            if w.starts_with('-') && !w.starts_with("--") && w.contains('c') {
                if let Some(script) = rest.next() {
                    add_line(found, script);
                }
                break;
            }
        }
    } else if program == "env"
        && let Some(line) = split_string(&words[1..])
    {
        // `env -S 'rm x'` splits its argument into the command it runs.
        add_line(found, line);
    } else if program == "eval" {
        add_line(found, &words[1..].join(" "));
    } else if program == "trap" {
        // `trap 'rm x' EXIT` runs its first argument when the signal comes.
        if let Some(line) = words[1..].iter().find(|w| !w.starts_with('-')) {
            add_line(found, line);
        }
    } else if program == "find" {
        let mut i = 1;
        while i < words.len() {
            if matches!(words[i].as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
                let end = words[i + 1..]
                    .iter()
                    .position(|w| w == ";" || w == "+")
                    .map_or(words.len(), |p| i + 1 + p);
                add(found, words[i + 1..end].to_vec());
                i = end;
            }
            i += 1;
        }
    } else if let Some((_, with_value, positional)) = WRAPPERS.iter().find(|w| w.0 == program) {
        for start in wrapped_starts(program, &words[1..], with_value, *positional) {
            add(found, words[1 + start..].to_vec());
        }
    }
}

/// Where in `args`, a wrapper's arguments, the command it runs may begin: past its
/// options (those in `with_value` with their value, given in the next word or joined,
/// `--user root`, `--user=root`, `-uroot`, or as the last letter of a bundle, `-iu root`),
/// its `positional` plain arguments (`timeout 5`, also after `--`) and, for `env`, its
/// assignments. An option it is not known to take a value with is read both ways, with
/// and without one (`sudo --preserve-env rm` runs `rm`, `sudo --frobnicate root rm` may
/// run `rm` too): every reading is judged, so that a deny rule is not dodged by an
/// option the table does not know. At most two readings per option, and readings that
/// meet again are not followed twice.
fn wrapped_starts(
    program: &str,
    args: &[String],
    with_value: &[&str],
    positional: usize,
) -> Vec<usize> {
    // (next word, plain arguments taken, past `--`)
    let mut todo = vec![(0, 0, false)];
    let mut seen = std::collections::HashSet::new();
    let mut starts = Vec::new();
    while let Some(state) = todo.pop() {
        if !seen.insert(state) {
            continue;
        }
        let (i, plain, ended) = state;
        let Some(w) = args.get(i).map(String::as_str) else { continue };
        if !ended && w == "--" {
            todo.push((i + 1, plain, true));
        } else if !ended && w.starts_with('-') && w.len() > 1 {
            for words in option_words(w, with_value) {
                todo.push((i + words, plain, false));
            }
        } else if program == "env" && is_assignment(w) {
            todo.push((i + 1, plain, ended));
        } else if plain < positional {
            todo.push((i + 1, plain + 1, ended));
        } else if !starts.contains(&i) {
            starts.push(i);
        }
    }
    starts.sort_unstable();
    starts
}

/// How many words the option `word` may take with its value: 2 for an option of
/// `with_value` given alone (`-u root`, `--user root`, a bundle ending in one, `-iu
/// root`), 1 for one with its value joined (`-uroot`, `--user=root`) or a long option
/// with `=`; both for an option not known to take a value, which may or may not take the
/// next word (or, in a bundle, the rest of its word).
fn option_words(word: &str, with_value: &[&str]) -> Vec<usize> {
    if let Some(long) = word.strip_prefix("--") {
        return match (long.contains('='), with_value.contains(&word)) {
            (true, _) => vec![1],
            (false, true) => vec![2],
            (false, false) => vec![1, 2],
        };
    }
    let letters: Vec<char> = word[1..].chars().collect();
    let known = |letter: &char| with_value.contains(&format!("-{letter}").as_str());
    // The value of a letter that takes one is the rest of the word, else the next word.
    let words_from = |at: usize| if at + 1 == letters.len() { 2 } else { 1 };
    if known(&letters[0]) {
        return vec![words_from(0)];
    }
    // The first letter unknown: the word alone or with the next one, unless a later
    // letter is known to take a value, and the letters before it are flags (the first may
    // also take the rest of the word as its value).
    match letters.iter().skip(1).position(known) {
        Some(k) if words_from(k + 1) == 2 => vec![1, 2],
        Some(_) => vec![1],
        None => vec![1, 2],
    }
}

/// The value of `env`'s `-S`/`--split-string` among `args`, if given.
fn split_string(args: &[String]) -> Option<&str> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-S" | "--split-string" => return args.next().map(String::as_str),
            joined if joined.starts_with("--split-string=") => {
                return Some(&joined["--split-string=".len()..]);
            }
            joined if joined.starts_with("-S") => return Some(&joined[2..]),
            _ => {}
        }
    }
    None
}

fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else { return false };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(line: &str) -> Vec<String> {
        split(line).commands.iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn splits_at_operators_and_removes_quotes() {
        assert_eq!(commands("git status && git diff"), ["git status", "git diff"]);
        assert_eq!(commands("a; b || c | d & e\nf"), ["a", "b", "c", "d", "e", "f"]);
        assert_eq!(commands(r#"git commit -m "a b; c" -q"#), ["git commit -m a b; c -q"]);
        assert_eq!(split(r#"git commit -m "a b; c""#).commands[0].len(), 4);
        assert_eq!(commands("echo 'x && y'"), ["echo x && y"]);
        assert_eq!(commands(r"echo a\ b"), ["echo a b"]);
        assert_eq!(commands("(cd x && rm y)"), ["cd x", "rm y"]);
        assert_eq!(commands("if true; then rm -rf x; fi"), ["true", "rm -rf x"]);
        assert_eq!(commands("for f in *; do rm $f; done"), ["for f in *", "rm $f"]);
        assert_eq!(commands("ls # && rm x"), ["ls"]);
        assert_eq!(commands("cargo test 2>&1 | tail -5"), ["cargo test 2>&1", "tail -5"]);
        assert_eq!(commands("echo hi>out.txt"), ["echo hi > out.txt"]);
        assert_eq!(commands("make &> log"), ["make &> log"]);
        // Digits or `-` after `>&` are a descriptor only as the whole word, as bash reads it.
        assert_eq!(commands("ls >&2keep.txt"), ["ls >& 2keep.txt"]);
        assert_eq!(commands("ls >1 x"), ["ls > 1 x"]);
        assert_eq!(commands("ls >- x"), ["ls > - x"]);
        assert_eq!(commands("ls >&2;ls 2>&1|cat <&-"), ["ls >&2", "ls 2>&1", "cat <&-"]);
        assert_eq!(commands("cat <<-EOF\n\tx\nEOF"), ["cat <<- EOF", "x", "EOF"]);
        assert_eq!(split("").commands, Vec::<Vec<String>>::new());
        assert_eq!(split("echo ''").commands, [vec!["echo".to_owned(), String::new()]]);
        assert_eq!(split("git status && git diff").opaque, None);
    }

    #[test]
    fn substitutions_make_a_line_opaque_but_still_split() {
        let line = split("echo $(rm -rf x)");
        assert_eq!(line.opaque, Some("a command substitution"));
        assert_eq!(commands("echo $(rm -rf x)"), ["echo", "rm -rf x"]);
        assert_eq!(commands("echo `rm x`"), ["echo", "rm x"]);
        assert_eq!(split(r#"echo "$(whoami)""#).opaque, Some("a command substitution"));
        assert_eq!(split("echo '$(whoami)'").opaque, None);
        assert_eq!(split("diff <(ls a) <(ls b)").opaque, Some("a process substitution"));
        assert_eq!(split("cat <<EOF\nx\nEOF").opaque, Some("a here-document"));
        assert_eq!(split("echo 'unclosed").opaque, Some("an unclosed quote"));
        assert_eq!(split("cat <<< word").opaque, None);
    }

    #[test]
    fn a_program_named_by_an_expansion_makes_a_line_opaque() {
        let why = Some(NAMED_BY_EXPANSION);
        for line in ["X=rm; $X -rf x", "${X} -rf x", r"$'\x72m' -rf x", "sudo $CMD x", "A=1 $B"] {
            assert_eq!(split(line).opaque, why, "{line}");
        }
        for line in ["echo $HOME", "rm \"$FILE\"", "cd $DIR && ls", "X=$(pwd)x ls"] {
            assert_ne!(split(line).opaque, why, "{line}");
        }
    }

    /// What runs is hidden from deny rules by a substituted program or a shell reading its
    /// input; a substitution in an argument, a script file or a `-c` line is not.
    #[test]
    fn hidden_programs_are_told() {
        for line in [
            "$(echo touch) f1",
            "`echo touch` f",
            "\"$(echo touch)\" f",
            "X=1 $(echo rm) x",
            "time -p $(echo rm) x",
            "bash -c \"$(echo touch) f\"",
            "echo 'touch f' | bash",
            "cat <<EOF | sh\ntouch f\nEOF",
            "sh < script.sh",
            "bash -c 'echo rm x | bash'",
        ] {
            assert!(hides_commands(split(line).opaque), "{line}: {:?}", split(line).opaque);
        }
        for line in [
            "echo $(date)",
            "git log `git rev-parse HEAD` -1",
            "bash -c 'ls'",
            "bash build.sh",
            "sh --version",
            "bash <<< 'ls'",
            "ls 2>&1 | tee log",
        ] {
            assert!(!hides_commands(split(line).opaque), "{line}: {:?}", split(line).opaque);
        }
        // Lines nested past a few levels are not split again and again: split level by
        // level, 200 levels would take longer than anyone waits, so a minute is a hang
        // guard, not a speed measure (it takes milliseconds; 5 s was missed under load).
        let line = format!("{}rm x", "eval ".repeat(200));
        let started = std::time::Instant::now();
        assert!(hides_commands(split(&line).opaque));
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}", started.elapsed());
    }

    /// Commands run later or under more wrappers are found for deny rules.
    #[test]
    fn deferred_and_wrapped_commands_are_found() {
        let inner = |line: &str| -> Vec<String> {
            let words = &split(line).commands[0];
            inner_commands(words).iter().map(|c| c.join(" ")).collect()
        };
        assert_eq!(inner("trap 'touch f' EXIT"), ["touch f"]);
        assert_eq!(commands("time -p touch f"), ["touch f"]);
        assert_eq!(inner("coproc touch f"), ["touch f"]);
        assert_eq!(inner("flock /tmp/l touch f"), ["touch f"]);
        assert_eq!(inner("flock -c 'touch f' /tmp/l"), ["touch f"]);
        assert_eq!(inner("taskset 1 touch f"), ["touch f"]);
        // `-o` is not known to take no value: `0` may be its value and `touch` the
        // priority, so `f` is judged too.
        assert_eq!(inner("chrt -o 0 touch f"), ["touch f", "f"]);
        assert_eq!(inner("strace -o /dev/null touch f"), ["touch f"]);
        assert_eq!(inner("su -c 'touch f' root"), ["touch f"]);
        assert_eq!(inner("bash <<< 'touch f'"), ["touch f"]);
    }

    #[test]
    fn env_split_strings_are_commands_too() {
        let inner = |line: &str| -> Vec<String> {
            let words = &split(line).commands[0];
            inner_commands(words).iter().map(|c| c.join(" ")).collect()
        };
        assert_eq!(inner("env -S 'rm -rf x'"), ["rm -rf x"]);
        assert_eq!(inner("env --split-string='rm x' "), ["rm x"]);
        assert_eq!(inner("env -S'sudo rm x'"), ["sudo rm x", "rm x"]);
    }

    #[test]
    fn finds_commands_under_wrappers() {
        let inner = |line: &str| -> Vec<String> {
            let words = &split(line).commands[0];
            inner_commands(words).iter().map(|c| c.join(" ")).collect()
        };
        assert_eq!(inner("sudo -u root rm -rf /"), ["rm -rf /"]);
        assert_eq!(inner("/bin/rm -rf x"), ["rm -rf x"]);
        assert_eq!(inner("FOO=1 BAR=2 rm x"), ["rm x"]);
        assert_eq!(inner("env -i FOO=1 rm x"), ["rm x"]);
        assert_eq!(inner("timeout -s KILL 10 rm x"), ["rm x"]);
        assert_eq!(inner("nice -n 5 nohup rm x"), ["nohup rm x", "rm x"]);
        assert_eq!(inner("bash -c 'ls && rm x'"), ["ls", "rm x"]);
        assert_eq!(inner("sh -ec \"sudo rm x\""), ["sudo rm x", "rm x"]);
        assert_eq!(inner("eval rm x"), ["rm x"]);
        assert_eq!(inner(r"find . -name '*.o' -exec rm {} \; -print"), ["rm {}"]);
        assert_eq!(commands("{ rm x; }"), ["rm x"]);
        assert_eq!(inner("xargs -n 1 rm"), ["rm"]);
        assert_eq!(inner("git status"), Vec::<String>::new());
        // Long options with their value in the next word or joined, a bundle whose last
        // letter takes a value, `--` before a wrapper's positional arguments.
        assert_eq!(inner("sudo --user root rm -rf x"), ["rm -rf x"]);
        assert_eq!(inner("sudo --user=root rm -rf x"), ["rm -rf x"]);
        assert_eq!(inner("sudo -uroot rm -rf x"), ["rm -rf x"]);
        assert_eq!(inner("xargs --max-args 1 rm"), ["rm"]);
        assert_eq!(inner("stdbuf --output L rm x"), ["rm x"]);
        assert_eq!(inner("timeout -- 5 rm -rf x"), ["rm -rf x"]);
        assert_eq!(inner("timeout -s KILL -- 5 rm -rf x"), ["rm -rf x"]);
        // An option not known to take a value is read both ways.
        assert_eq!(inner("sudo -iu root rm -rf x"), ["root rm -rf x", "rm -rf x"]);
        assert_eq!(inner("sudo --frobnicate root rm x"), ["root rm x", "rm x"]);
        assert_eq!(inner("sudo -E rm x"), ["rm x", "x"]);
        assert_eq!(inner("sudo -Xu root rm x"), ["root rm x", "rm x"]);
    }
}
