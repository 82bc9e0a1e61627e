//! What every crate's named crash points share: the way the process dies, and the macro that
//! names a point. Each crate lists its own points (`crash::POINTS`) and keeps its own
//! `crash-points` feature, which turns this crate's on.

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
