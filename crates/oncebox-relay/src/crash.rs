//! Named crash points of the relay: with the `crash-points` feature a test process can arm one
//! so the process SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Do not rename: process-level tests name it.
pub const POINTS: [&str; 1] = ["relay-before-record"];

pub(crate) use oncebox_core::crash_point as point;
