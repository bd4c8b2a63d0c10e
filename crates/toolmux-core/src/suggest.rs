//! Hints for a misspelled word: the configuration loader's unknown keys and values, a REST
//! tool's unknown arguments.

/// The candidate closest to `word`, when close enough to be a typo: a third of the longer
/// word's characters at most (at least one) by [`distance`], case ignored.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let lower = word.to_lowercase();
    candidates
        .iter()
        .map(|c| (distance(&lower, &c.to_lowercase()), *c))
        .filter(|(d, c)| *d <= (c.chars().count().max(word.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edit distance counting insertions, deletions, substitutions and swaps of neighbours
/// (optimal string alignment).
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::{closest, distance};

    #[test]
    fn typos_are_found() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("raed", "read"), 1, "a swap of neighbours is one edit");
        assert_eq!(closest("comand", &["command", "args"]), Some("command"));
        assert_eq!(closest("xyz", &["command", "args"]), None);
        assert_eq!(closest("ENV", &["env", "args"]), Some("env"));
        assert_eq!(closest("raed", &["read", "write"]), Some("read"));
    }
}
