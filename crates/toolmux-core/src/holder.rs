//! The run ids of key holders: `key:HOLDER/REST`, with the holder encoded so that it
//! always ends at the first `/`.
//!
//! `toolmux serve --http` names every run of an API key's holder (the key's name, or
//! `oauth:SUBJECT` for an access token) `key:HOLDER/…`, and what keeps tenants apart (the
//! external tools' pending calls, spaces, event streams, per-holder statistics) reads the
//! holder back from the run id. Holder names may themselves contain `/` (a key named
//! `team/ci`, a subject that is a URL), so the holder is written with `%` and `/`
//! percent-encoded: two different holders never share a prefix, and reading it back is
//! exact.

use std::borrow::Cow;

/// The run id `key:HOLDER/rest` of a run of key holder `holder`.
pub fn holder_run_id(holder: &str, rest: &str) -> String {
    format!("{}{rest}", holder_run_prefix(holder))
}

/// The prefix `key:HOLDER/` every run id of key holder `holder` starts with, and no run
/// id of another holder does.
pub fn holder_run_prefix(holder: &str) -> String {
    let mut prefix = String::with_capacity(holder.len() + 5);
    prefix.push_str("key:");
    for c in holder.chars() {
        match c {
            '%' => prefix.push_str("%25"),
            '/' => prefix.push_str("%2F"),
            c => prefix.push(c),
        }
    }
    prefix.push('/');
    prefix
}

/// The key holder a run belongs to, decoded: `team/ci` of `key:team%2Fci/s1`, `alice` of
/// `key:alice/s1` or `key:alice`; `None` for runs that are not a key holder's.
pub fn run_holder(run_id: &str) -> Option<Cow<'_, str>> {
    let rest = run_id.strip_prefix("key:")?;
    let encoded = rest.split_once('/').map_or(rest, |(holder, _)| holder);
    if !encoded.contains('%') {
        return Some(Cow::Borrowed(encoded));
    }
    let mut decoded = String::with_capacity(encoded.len());
    let mut chars = encoded.char_indices();
    while let Some((at, c)) = chars.next() {
        match (c, encoded.get(at + 1..at + 3)) {
            ('%', Some("25")) => decoded.push('%'),
            ('%', Some(code)) if code.eq_ignore_ascii_case("2F") => decoded.push('/'),
            // Not written by `holder_run_prefix`: kept as it is.
            (c, _) => {
                decoded.push(c);
                continue;
            }
        }
        chars.next();
        chars.next();
    }
    Some(Cow::Owned(decoded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_with_slashes_read_back_exactly() {
        for holder in ["alice", "team/ci", "team", "oauth:https://idp.example/u/1", "50%/x", "%2F"]
        {
            let run = holder_run_id(holder, "s1/client:x");
            assert_eq!(run_holder(&run).as_deref(), Some(holder), "{run}");
        }
        assert_eq!(holder_run_id("team/ci", "s1"), "key:team%2Fci/s1");
        assert_eq!(run_holder("key:bob").as_deref(), Some("bob"));
        assert_eq!(run_holder("run-1"), None);
    }

    #[test]
    fn one_holders_prefix_is_no_other_holders() {
        let team = holder_run_prefix("team");
        let ci = holder_run_id("team/ci", "s1");
        assert!(!ci.starts_with(&team), "{ci} starts with {team}");
        assert_ne!(run_holder(&ci), run_holder(&holder_run_id("team/web", "s1")));
    }
}
