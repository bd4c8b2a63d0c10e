//! The seccomp filter is written for Linux on little-endian x86-64 and aarch64: elsewhere
//! `network: false` rests on Landlock alone (TCP only) where there is Landlock.

/// Never available here.
pub(super) fn available() -> Result<(), String> {
    Err("the seccomp filter is built for Linux on x86-64 and aarch64 only".to_owned())
}

/// Never built here: [`available`] fails first.
#[derive(Debug)]
pub(super) struct Filter;

impl Filter {
    pub(super) fn network() -> Filter {
        Filter
    }

    pub(super) fn install(&self) -> std::io::Result<()> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}
