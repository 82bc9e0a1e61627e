//! Named crash points of the consumer: with the `crash-points` feature a test process can arm one
//! so the process SIGKILLs itself exactly there; without the feature they compile to nothing.

/// Do not rename: process-level tests name it. Between the store's commit and the broker ack.
pub const POINTS: [&str; 1] = ["nats-before-ack"];

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

macro_rules! point {
    ($name:literal) => {
        ::fail::fail_point!($name, |_| { $crate::crash::die() })
    };
}
pub(crate) use point;
