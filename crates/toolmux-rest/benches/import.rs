//! Benchmark placeholder, filled below.
fn main() {}
