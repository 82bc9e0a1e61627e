//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected. The gateway's ingest passes them in this order, once per
/// batch transaction, or once per event on the per-event path (ordered events, keys under a
/// lease, `process`). The names and meanings are SQLite's: `before-commit` is just before the
/// transaction's COMMIT, `after-commit` right after it returned, before anyone is answered. Do
/// not rename: crash tests and operators' soak scripts name them.
pub const POINTS: [&str; 2] = ["before-commit", "after-commit"];

pub(crate) use oncebox_core::crash_point as point;
