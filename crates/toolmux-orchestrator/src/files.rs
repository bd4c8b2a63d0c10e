//! Opening the files the orchestrator keeps (stored outputs, the statistics file and its
//! lock, the audit log) without following a symbolic link where toolmux names a file.
//!
//! These files often live in a project's folder, which a cloned repository fills: a link
//! planted in place of one (`out-1 -> /etc/passwd`, `audit.jsonl -> ~/.bashrc`) must not
//! make toolmux read or write the file it leads to. `toolmux_core::regular` refuses FIFOs
//! and devices but follows links; these do the same and follow none (`O_NOFOLLOW`), a link
//! being refused as what it is.

use std::fs::{File, FileType, OpenOptions};
use std::io::Read as _;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use toolmux_core::regular::{RegularError, kind_in_words};

/// What a file that is no regular file is, in words, a symbolic link included.
pub(crate) fn kind_of(kind: FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else {
        kind_in_words(kind).unwrap_or("of a type no word names")
    }
}

/// What the entry `name` of the folder `dir` is in words, a link not followed; `None` for
/// a regular file or an entry that cannot be asked about.
pub(crate) fn kind_at(dir: impl AsFd, name: &str) -> Option<&'static str> {
    use rustix::fs::FileType as Kind;
    let stat = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some(match Kind::from_raw_mode(stat.st_mode) {
        Kind::RegularFile => return None,
        Kind::Symlink => "a symbolic link",
        Kind::Directory => "a folder",
        Kind::Fifo => "a FIFO (named pipe)",
        Kind::CharacterDevice => "a character device",
        Kind::BlockDevice => "a block device",
        Kind::Socket => "a socket",
        Kind::Unknown => "of a type no word names",
    })
}

/// Opens `path` as `options` say, refusing anything but a regular file, a symbolic link
/// included (`O_NOFOLLOW`), without waiting (`O_NONBLOCK`, `O_NOCTTY`): as
/// `toolmux_core::regular::open_regular`, which follows links.
pub(crate) fn open_regular(path: &Path, options: &mut OpenOptions) -> Result<File, RegularError> {
    let flags =
        rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::NOFOLLOW;
    let file = match options.custom_flags(flags.bits() as i32).open(path) {
        Ok(file) => file,
        // A link fails with ELOOP, a FIFO without a reader refuses a writer (ENXIO): say
        // what it is, not that.
        Err(e) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(meta) if !meta.is_file() => {
                    RegularError::NotRegular(Some(kind_of(meta.file_type())))
                }
                _ => RegularError::Io(e),
            });
        }
    };
    let meta = file.metadata().map_err(RegularError::Io)?;
    if !meta.is_file() {
        return Err(RegularError::NotRegular(Some(kind_of(meta.file_type()))));
    }
    Ok(file)
}

/// The bytes of the regular file at `path`, at most `limit`, a symbolic link refused: as
/// `toolmux_core::regular::read_regular`, which follows links. The type and size are
/// checked before opening (a device is never opened) and again on the opened file.
pub(crate) fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, RegularError> {
    let meta = std::fs::symlink_metadata(path).map_err(RegularError::Io)?;
    if !meta.is_file() {
        return Err(RegularError::NotRegular(Some(kind_of(meta.file_type()))));
    }
    if meta.len() > limit {
        return Err(RegularError::TooBig { len: Some(meta.len()), limit });
    }
    let file = open_regular(path, OpenOptions::new().read(true))?;
    let len = file.metadata().map_err(RegularError::Io)?.len();
    if len > limit {
        return Err(RegularError::TooBig { len: Some(len), limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(RegularError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(RegularError::TooBig { len: None, limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_test_support::blocking::fifo;

    fn said(result: Result<impl std::fmt::Debug, RegularError>) -> String {
        result.map_err(|e| e.to_string()).expect_err("refused")
    }

    #[test]
    fn a_symbolic_link_is_refused_as_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "secret").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(said(read_regular(&link, 1024)), "it is a symbolic link, not a regular file");
        let mut append = OpenOptions::new();
        append.create(true).append(true);
        assert_eq!(
            said(open_regular(&link, &mut append)),
            "it is a symbolic link, not a regular file"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret", "nothing written");
        // A link to nothing is not followed to create what it names.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("made"), &dangling).unwrap();
        assert_eq!(
            said(open_regular(&dangling, &mut append)),
            "it is a symbolic link, not a regular file"
        );
        assert!(!dir.path().join("made").exists());
        fifo(dir.path(), "pipe");
        assert_eq!(
            said(read_regular(&dir.path().join("pipe"), 1024)),
            "it is a FIFO (named pipe), not a regular file"
        );
        assert_eq!(read_regular(&target, 1024).unwrap(), b"secret");
    }
}
