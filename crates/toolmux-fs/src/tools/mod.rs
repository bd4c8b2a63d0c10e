//! The tools, one module each; each exposes its argument type, its description and a
//! function doing the work. `text` (encodings and line endings) and `spill` (private files
//! for full command output) are shared by several.

pub(crate) mod block;
pub(crate) mod edit;
pub(crate) mod glob;
pub(crate) mod grep;
pub(crate) mod ls;
pub(crate) mod patch;
pub(crate) mod pty;
pub(crate) mod read;
pub(crate) mod shell;
pub(crate) mod spill;
pub(crate) mod tasks;
pub(crate) mod text;
pub(crate) mod undo;
pub(crate) mod write;
