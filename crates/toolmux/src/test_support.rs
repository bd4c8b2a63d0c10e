//! What the facade's unit tests share: FIFOs to refuse, and work that must end in time,
//! from `toolmux_test_support::blocking`, as the orchestrator's tests have them.

pub(crate) use toolmux_test_support::blocking::{fifo, within_10s};
