//! Named crash points: with the `crash-points` feature a test child can arm one so the process
//! SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Where a crash can be injected. The gateway's ingest passes them in this order, once per
/// batch transaction, or once per event on the per-event path (ordered events, keys under a
/// lease, `process`). The names and meanings are SQLite's: `before-commit` is just before the
/// transaction's COMMIT, `after-commit` right after it returned, before anyone is answered. Do
/// not rename: crash tests and operators' soak scripts name them.
pub const POINTS: [&str; 2] = ["before-commit", "after-commit"];

/// Stops the process the way the OOM killer would: SIGKILL, no destructors, no flush.
///
/// Always compiled: another crate of the same build may turn on `fail`'s failpoints, which makes
/// the points below live even when this crate's own feature is off.
pub fn die() -> ! {
    #[cfg(feature = "crash-points")]
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught, so this is only reached without the feature or if raising it
    // failed.
    std::process::abort()
}

/// Expands to a failpoint named `name`; when armed with the `return` action the process dies.
macro_rules! point {
    ($name:literal) => {
        ::fail::fail_point!($name, |_| { $crate::crash::die() })
    };
}
pub(crate) use point;
