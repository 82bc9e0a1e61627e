//! What every crate's named crash points share: the way the process dies, and the macro that
//! names a point. Each crate lists its own points (`crash::POINTS`) and keeps its own
//! `crash-points` feature, which turns this crate's on.

/// The points every store's write path passes, in this order (each store's `crash::POINTS`
/// says where exactly): `after-begin` once its transaction has begun, `after-inbox-insert`
/// once the records are inserted, `after-effect` once the effect is made (the handler
/// returned; in the gateway's ingest, the deliveries are queued), `before-commit` just before
/// COMMIT, `after-commit` right after it returned, before anyone is answered. Do not rename:
/// crash tests and operators' soak scripts name them.
pub const STORE_POINTS: [&str; 5] = [
    "after-begin",
    "after-inbox-insert",
    "after-effect",
    "before-commit",
    "after-commit",
];

/// Stops the process the way the OOM killer would: SIGKILL, no destructors, no flush.
///
/// Always compiled: any crate of the build may turn on `fail`'s failpoints, which makes every
/// crate's points live even where that crate's own feature is off; without this crate's
/// `crash-points` feature such a point aborts instead.
pub fn die() -> ! {
    #[cfg(feature = "crash-points")]
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught, so this is only reached without the feature or if raising it
    // failed.
    std::process::abort()
}

/// Expands to a failpoint named `name`; when armed with the `return` action the process dies.
/// The calling crate depends on `fail`; without `fail/failpoints` the point compiles to nothing.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        ::fail::fail_point!($name, |_| { $crate::crash::die() })
    };
}
