//! Named crash points of the ingress, before the store is touched: with the `crash-points`
//! feature a test child can arm one so the process SIGKILLs itself exactly there; without the
//! feature they compile to nothing.

/// Where a crash can be injected, in the order a request passes them (the store's own points
/// follow). Do not rename: crash tests and operators' soak scripts name them.
pub const POINTS: [&str; 2] = ["after-body-read", "after-signature-check"];

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
