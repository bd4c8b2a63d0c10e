//! The tools, one module each; each exposes its argument type, its description and a
//! function doing the work. `text` (encodings and line endings) is shared by several.

pub(crate) mod edit;
pub(crate) mod glob;
pub(crate) mod grep;
pub(crate) mod ls;
pub(crate) mod read;
pub(crate) mod shell;
pub(crate) mod tasks;
pub(crate) mod text;
pub(crate) mod write;
