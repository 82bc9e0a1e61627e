//! Named crash points of the consumer: with the `crash-points` feature a test process can arm one
//! so the process SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Do not rename: process-level tests name it. Between the store's commit and the broker ack.
pub const POINTS: [&str; 1] = ["nats-before-ack"];

pub(crate) use oncebox_core::crash_point as point;
