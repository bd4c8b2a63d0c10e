//! Close names for an unknown tool or prompt: the model misspelled it, dropped the
//! namespace, or used another provider's prefix.

/// The most characters of a name a caller gave that an error repeats.
pub(crate) const ECHO_MAX_CHARS: usize = 200;

/// `name`, as given by a caller, for an error to repeat: whole up to 200 characters, else
/// its first 200 and how long it was. A 10,000-character tool name came back whole, into
/// the model's context and every log line the error reached.
pub(crate) fn echoed(name: &str) -> String {
    match name.char_indices().nth(ECHO_MAX_CHARS) {
        None => name.to_owned(),
        Some((cut, _)) => format!("{}… ({} characters)", &name[..cut], name.chars().count()),
    }
}

/// Up to three of `names` closest to `wanted`, best first.
pub fn suggest<'a>(names: impl Iterator<Item = &'a str>, wanted: &str) -> Vec<String> {
    let wanted_lower = wanted.to_ascii_lowercase();
    let wanted_tool =
        toolmux_core::naming::split(&wanted_lower).map_or(wanted_lower.as_str(), |(_, t)| t);
    let limit = (wanted_tool.len() / 3).max(2);
    // The distance is at least the difference in length: names that far apart are not
    // compared (a name of a megabyte cost seconds against every tool).
    let distance = |a: &str, b: &str, plus: usize| {
        (a.len().abs_diff(b.len()) + plus <= limit).then(|| edit_distance(a, b) + plus)
    };
    let mut scored: Vec<(usize, &str)> = names
        .filter_map(|name| {
            let lower = name.to_ascii_lowercase();
            let tool = toolmux_core::naming::split(&lower).map_or(lower.as_str(), |(_, t)| t);
            // A bare tool name that exists under some namespace is the best hint there is.
            let score = if tool == wanted_tool {
                0
            } else {
                let full = distance(&lower, &wanted_lower, 0);
                let part = distance(tool, wanted_tool, 1);
                full.into_iter().chain(part).min()?
            };
            (score <= limit).then_some((score, name))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, n)| n.to_owned()).collect()
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    /// Names whose lengths differ by more than the limit are not compared (a name of a
    /// megabyte took seconds against every tool); close ones still are.
    #[test]
    fn names_far_apart_in_length_are_not_compared() {
        let names = ["fs__read", "fs__write", "github__search_code"];
        let huge = format!("fs__{}", "x".repeat(4 << 20));
        assert!(super::suggest(names.into_iter(), &huge).is_empty());
        assert_eq!(super::suggest(names.into_iter(), "fs__raed"), ["fs__read"]);
        assert_eq!(super::suggest(names.into_iter(), "read"), ["fs__read"]);
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("read", "reed"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
