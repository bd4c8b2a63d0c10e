//! The process groups' watchman, shared with every crate that starts children (see
//! [`toolmux_core::group_guard`]): one per toolmux process.

pub(crate) use toolmux_core::group_guard::{GroupGuard, LeaderExit};
