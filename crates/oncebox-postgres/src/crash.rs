//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected ([`oncebox_core::crash::STORE_POINTS`]). The gateway's ingest
/// passes them in this order, once per batch transaction, or once per event on the per-event
/// path (ordered events, `process`).
pub const POINTS: [&str; 5] = oncebox_core::crash::STORE_POINTS;

pub(crate) use oncebox_core::crash_point as point;
