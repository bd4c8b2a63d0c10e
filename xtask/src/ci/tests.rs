//! Tests of the command lines `cargo xtask ci` runs.

use std::path::Path;

use super::feature_commands;
use crate::cmd;

/// The features step checks the facade with no feature and each alone, then runs its unit
/// tests with the providers but not `external`, each run without the default features.
#[test]
fn the_features_step_runs_each_feature_alone_then_the_unit_tests() {
    let lines: Vec<String> = feature_commands(Path::new(".")).iter().map(cmd::display).collect();
    let check = "cargo check --locked -p toolmux --no-default-features";
    assert_eq!(
        lines,
        [
            check.to_owned(),
            format!("{check} --features fs"),
            format!("{check} --features mcp"),
            format!("{check} --features rest"),
            format!("{check} --features external"),
            format!("{check} --features agent"),
            format!("{check} --features redis"),
            format!("{check} --features otel"),
            format!("{check} --features tower"),
            "cargo test --lib --locked -p toolmux --no-default-features --features fs,mcp,rest,agent"
                .to_owned(),
        ]
    );
}
