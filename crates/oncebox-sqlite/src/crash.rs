//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected ([`oncebox_core::crash::STORE_POINTS`]). The gateway's ingest
/// and a `process` that takes over an expired lease pass them in this order; `process` on a
/// new key writes its record after the handler's effect, in the same transaction, so it
/// passes `after-effect` before `after-inbox-insert`.
pub const POINTS: [&str; 5] = oncebox_core::crash::STORE_POINTS;

pub(crate) use oncebox_core::crash_point as point;
