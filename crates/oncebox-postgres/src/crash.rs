//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected. The gateway's ingest passes them in this order, once per
/// batch transaction, or once per event on the per-event path (ordered events, `process`).
/// The names and meanings are SQLite's: `after-begin` once the transaction has begun,
/// `after-inbox-insert` once the records are inserted (on the per-event path: a new key's
/// record), `after-effect` once the deliveries are queued (the handler returned),
/// `before-commit` just before the transaction's COMMIT, `after-commit` right after it
/// returned, before anyone is answered. Do not rename: crash tests and operators' soak
/// scripts name them.
pub const POINTS: [&str; 5] = [
    "after-begin",
    "after-inbox-insert",
    "after-effect",
    "before-commit",
    "after-commit",
];

pub(crate) use oncebox_core::crash_point as point;
