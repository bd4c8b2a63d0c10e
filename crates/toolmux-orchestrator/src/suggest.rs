//! Close names for an unknown tool or prompt: the model misspelled it, dropped the
//! namespace, or used another provider's prefix.

/// Up to three of `names` closest to `wanted`, best first.
pub fn suggest<'a>(names: impl Iterator<Item = &'a str>, wanted: &str) -> Vec<String> {
    let wanted_lower = wanted.to_ascii_lowercase();
    let wanted_tool =
        toolmux_core::naming::split(&wanted_lower).map_or(wanted_lower.as_str(), |(_, t)| t);
    let mut scored: Vec<(usize, &str)> = names
        .filter_map(|name| {
            let lower = name.to_ascii_lowercase();
            let tool = toolmux_core::naming::split(&lower).map_or(lower.as_str(), |(_, t)| t);
            // A bare tool name that exists under some namespace is the best hint there is.
            let score = if tool == wanted_tool {
                0
            } else {
                let full = edit_distance(&lower, &wanted_lower);
                let part = edit_distance(tool, wanted_tool) + 1;
                full.min(part)
            };
            let limit = (wanted_tool.len() / 3).max(2);
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

    #[test]
    fn distances() {
        assert_eq!(edit_distance("read", "reed"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
