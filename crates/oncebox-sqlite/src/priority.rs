//! The writer thread's scheduling priority (it is the one serial section every commit waits on),
//! and the CPU the storage threads are kept on (`placement.rs` says which and why).
//!
//! Why: on a busy machine the writer competes for a CPU with the threads that parse requests.
//! Each time it is preempted, every caller in its batch waits, and the callers that keep the
//! CPU busy meanwhile are only queueing more work for it. Measured on two cores under HTTP
//! load, the writer waited for a CPU as long as it ran. A higher priority (a lower nice value)
//! lets it run when it has work; it has none most of the time, so others lose little.
//!
//! Raising a priority needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` allowing it); without it the
//! call fails and the writer keeps the default priority, which changes speed, not results.
#![allow(
    unsafe_code,
    reason = "setpriority(2) has no safe wrapper in the crates used here"
)]

/// The writer's nice value when the process may set it: ahead of request threads, behind
/// anything the operator raised further.
const WRITER_NICE: libc::c_int = -10;

/// Raises the calling thread's priority; returns whether it took effect.
pub(crate) fn raise() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take plain integers and touch no memory of ours;
        // on Linux PRIO_PROCESS with a thread id applies to that one thread.
        unsafe {
            let tid = libc::gettid();
            let Ok(who) = libc::id_t::try_from(tid) else {
                return false;
            };
            libc::setpriority(libc::PRIO_PROCESS, who, WRITER_NICE) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Keeps the calling thread on `cpu`; returns whether it took effect (a CPU outside the
/// process's set, or past the kernel's count, is refused and changes nothing).
pub(crate) fn pin(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        use nix::sched::{CpuSet, sched_setaffinity};
        let mut set = CpuSet::new();
        // Pid 0 is the calling thread.
        set.set(cpu).is_ok() && sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// Where the process may raise a priority (CI runs as root), the thread that asked runs
    /// at the writer's nice value, and only that thread.
    #[test]
    fn raises_only_the_calling_thread() {
        let raised = std::thread::spawn(|| {
            let raised = super::raise();
            // SAFETY: getpriority reads a number; errno is cleared first as its manual asks.
            let nice = unsafe {
                *libc::__errno_location() = 0;
                let tid = libc::id_t::try_from(libc::gettid()).unwrap();
                libc::getpriority(libc::PRIO_PROCESS, tid)
            };
            (raised, nice)
        })
        .join()
        .unwrap();
        // SAFETY: as above, for this thread.
        let mine = unsafe {
            let tid = libc::id_t::try_from(libc::gettid()).unwrap();
            libc::getpriority(libc::PRIO_PROCESS, tid)
        };
        if raised.0 {
            assert_eq!(raised.1, super::WRITER_NICE);
        }
        assert_ne!(
            mine,
            super::WRITER_NICE,
            "the caller's own priority is untouched"
        );
    }
}
