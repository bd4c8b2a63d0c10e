//! The vocabulary.
