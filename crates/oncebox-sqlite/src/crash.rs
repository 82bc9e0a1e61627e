//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected. The gateway's ingest and a `process` that takes over an
/// expired lease pass them in this order; `process` on a new key writes its record after the
/// handler's effect, in the same transaction, so it passes `after-effect` before
/// `after-inbox-insert`. Do not rename: crash tests and operators' soak scripts name them.
pub const POINTS: [&str; 5] = [
    "after-begin",
    "after-inbox-insert",
    "after-effect",
    "before-commit",
    "after-commit",
];

pub(crate) use oncebox_core::crash_point as point;
