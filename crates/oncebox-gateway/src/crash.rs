//! Named crash points of the ingress, before the store is touched: with the `crash-points`
//! feature a test child can arm one so the process SIGKILLs itself exactly there; without the
//! feature they compile to nothing.

/// Where a crash can be injected, in the order a request passes them (the store's own points
/// follow). Do not rename: crash tests and operators' soak scripts name them.
pub const POINTS: [&str; 2] = ["after-body-read", "after-signature-check"];

pub(crate) use oncebox_core::crash_point as point;
