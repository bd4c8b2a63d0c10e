//! Tests of rendering, section replacement and whole codegen runs in a scratch directory.
//! The generated files' freshness is checked by `cargo xtask ci`'s codegen step and, for the
//! configuration schema, by `toolmux-cli`'s tests (`config schema` against the file), not
//! here: running a generator's `cargo run -p` inside the test run built most of the
//! workspace again with another feature set (148 s, the slowest test of the run).

use std::fs;
use std::path::{Path, PathBuf};

use super::{Binaries, Generator, HEADER, Mode, render, replace_section, run_generators};

#[test]
fn json_gets_a_top_level_comment() {
    let generator = Generator { path: "schema.json", section: None, command: &[], binary: None };
    let rendered = render(&generator, r#"{"type": "object", "title": "Config"}"#, None).unwrap();
    assert_eq!(
        rendered,
        format!(
            "{{\n  \"$comment\": \"{HEADER}\",\n  \"title\": \"Config\",\n  \"type\": \"object\"\n}}\n"
        )
    );
    let error = render(&generator, "[1, 2]", None).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the generator of schema.json printed JSON that is not an object"
    );
}

#[test]
fn headers_follow_the_format() {
    let render_path = |path: &'static str| {
        render(&Generator { path, section: None, command: &[], binary: None }, "body", None)
            .unwrap()
    };
    assert_eq!(render_path("a.md"), format!("<!-- {HEADER} -->\n\nbody\n"));
    assert_eq!(render_path("a.rs"), format!("//! {HEADER}\n\nbody\n"));
    assert_eq!(render_path("a.toml"), format!("# {HEADER}\n\nbody\n"));
    assert_eq!(render_path("a.txt"), "body\n");
}

#[test]
fn sections_are_replaced_between_markers() {
    let readme =
        "# toolmux\n<!-- codegen:tools start -->\nold\nlines\n<!-- codegen:tools end -->\ntail\n";
    let generator =
        Generator { path: "README.md", section: Some("tools"), command: &[], binary: None };
    assert_eq!(
        render(&generator, "| tool |", Some(readme)).unwrap(),
        format!(
            "# toolmux\n<!-- codegen:tools start -->\n<!-- {HEADER} -->\n| tool |\n\
             <!-- codegen:tools end -->\ntail\n"
        )
    );
    let error = replace_section("no markers\n", "tools", "x").unwrap_err();
    assert_eq!(error.to_string(), "no `<!-- codegen:tools start -->` line");
    let reversed = "<!-- codegen:t end -->\n<!-- codegen:t start -->\n";
    let error = replace_section(reversed, "t", "x").unwrap_err();
    assert_eq!(
        error.to_string(),
        "`<!-- codegen:t end -->` comes before `<!-- codegen:t start -->`"
    );
}

/// A directory of its own under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn error_of(root: &Path, generators: &[Generator], mode: Mode) -> String {
    format!("{:#}", run_generators(root, generators, mode, Binaries::Build).unwrap_err())
}

#[test]
fn check_fails_on_stale_files_until_written() {
    let scratch = Scratch::new("codegen-stale");
    let root = &scratch.0;
    fs::write(root.join("README.md"), "<!-- codegen:n start -->\n<!-- codegen:n end -->\n")
        .unwrap();
    let generators = [
        Generator {
            path: "out/config.json",
            section: None,
            command: &["echo", r#"{"a": 1}"#],
            binary: None,
        },
        Generator {
            path: "README.md",
            section: Some("n"),
            command: &["echo", "one"],
            binary: None,
        },
    ];
    assert_eq!(
        error_of(root, &generators, Mode::Check),
        "generated files are stale:\n  README.md\n  out/config.json\n\
         run `cargo xtask codegen` to update them"
    );
    run_generators(root, &generators, Mode::Write, Binaries::Build).unwrap();
    run_generators(root, &generators, Mode::Check, Binaries::Build).unwrap();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    assert_eq!(
        readme,
        format!("<!-- codegen:n start -->\n<!-- {HEADER} -->\none\n<!-- codegen:n end -->\n")
    );

    fs::write(root.join("out/config.json"), "{}\n").unwrap();
    assert!(error_of(root, &generators, Mode::Check).contains("\n  out/config.json\n"));
}

#[test]
fn markers_without_a_generator_are_an_error() {
    let scratch = Scratch::new("codegen-orphan");
    fs::write(scratch.0.join("README.md"), "x\n<!-- codegen:tools start -->\n").unwrap();
    assert_eq!(
        error_of(&scratch.0, &[], Mode::Check),
        "codegen markers without a generator (add one to GENERATORS in xtask/src/codegen.rs, \
         or remove the markers):\nREADME.md:2: `codegen:tools`"
    );
}

#[test]
fn failing_commands_name_the_file() {
    let scratch = Scratch::new("codegen-fail");
    let generators =
        [Generator { path: "a.json", section: None, command: &["false"], binary: None }];
    assert_eq!(
        error_of(&scratch.0, &generators, Mode::Check),
        "cannot generate a.json: `false` failed (exit status: 1)"
    );
}

#[test]
fn a_built_binary_runs_with_the_arguments_after_the_dashes() {
    use std::os::unix::fs::PermissionsExt as _;

    let scratch = Scratch::new("codegen-built");
    let root = &scratch.0;
    let bin = root.join("bin");
    fs::create_dir(&bin).unwrap();
    let script = bin.join("printer");
    fs::write(&script, "#!/bin/sh\nprintf '%s|' \"$@\"\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    // Built, `false` (standing for `cargo run ... --bin printer`) never runs.
    let generators = [Generator {
        path: "out.txt",
        section: None,
        command: &["false", "--bin", "printer", "--", "config", "schema"],
        binary: Some("printer"),
    }];
    run_generators(root, &generators, Mode::Write, Binaries::Built(&bin)).unwrap();
    assert_eq!(fs::read_to_string(root.join("out.txt")).unwrap(), "config|schema|\n");

    // A folder without the binary: the command builds and runs it, here failing.
    assert_eq!(
        format!(
            "{:#}",
            run_generators(root, &generators, Mode::Check, Binaries::Built(&root.join("none")))
                .unwrap_err()
        ),
        "cannot generate out.txt: `false --bin printer -- config schema` failed (exit status: 1)"
    );

    // Told to run a built binary, a command without `--` is refused, not guessed at.
    let generators = [Generator {
        path: "out.txt",
        section: None,
        command: &["false", "printer"],
        binary: Some("printer"),
    }];
    assert_eq!(
        format!(
            "{:#}",
            run_generators(root, &generators, Mode::Check, Binaries::Built(&bin)).unwrap_err()
        ),
        "the command for out.txt runs the binary `printer` but has no `--` before that \
         binary's arguments"
    );
}
