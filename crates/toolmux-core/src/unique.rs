//! Names no other process makes.

use std::hash::{BuildHasher as _, Hasher as _};

/// 48 random bits in hex (12 digits), fresh on every call: the standard library's
/// per-process random hash keys mixed with the process id and the time, so no
/// random-number crate is needed for an id. For what must differ between processes that
/// share a folder or a Redis (replicas, a restarted server, a process id used again).
pub fn unique_token() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    format!("{:012x}", hasher.finish() & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_differ_and_are_twelve_hex_digits() {
        let (a, b) = (super::unique_token(), super::unique_token());
        assert_ne!(a, b);
        assert!(a.len() == 12 && a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
