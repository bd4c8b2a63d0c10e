//! Landlock is Linux's: elsewhere there is no ABI, so the default sandbox is off and an
//! explicit one refuses every command.

use super::Policy;

/// Never an ABI here.
pub(super) fn abi() -> Result<u32, String> {
    Err("Landlock, the sandbox toolmux uses, exists on Linux only".to_owned())
}

/// Never built here: [`abi`] fails first.
#[derive(Debug)]
pub(super) struct Ruleset;

impl Ruleset {
    pub(super) fn build(_policy: &Policy) -> Result<Ruleset, String> {
        Err(abi().err().unwrap_or_default())
    }
}

/// Never called here: no ruleset or filter is ever built.
pub(super) fn restrict_on_exec(
    _command: &mut tokio::process::Command,
    _views: Option<super::mounts::ReadOnlyViews>,
    _ruleset: Option<Ruleset>,
    _filter: Option<super::seccomp::Filter>,
) {
}
