//! The call pipeline.
