//! User and mount namespaces are Linux's: elsewhere protected paths get no read-only view
//! (and there is no Landlock to need one).

use std::path::{Path, PathBuf};

/// Never available here.
pub(super) fn available() -> Result<(), String> {
    Err("read-only views need Linux's user and mount namespaces".to_owned())
}

/// No socket is covered here.
pub(super) fn bound_sockets() -> Vec<PathBuf> {
    Vec::new()
}

/// Never prepared here: [`available`] fails first.
#[derive(Debug)]
pub(super) struct ReadOnlyViews;

impl ReadOnlyViews {
    pub(super) fn prepare(
        _read_only: &[PathBuf],
        _hidden: &[PathBuf],
        _sockets: &[PathBuf],
        _writable: &[PathBuf],
        _cwd: Option<&Path>,
    ) -> ReadOnlyViews {
        ReadOnlyViews
    }

    pub(super) fn is_empty(&self) -> bool {
        true
    }
}
