//! Whether the database file a store opened is still the file at its path. In WAL mode SQLite
//! raises nothing when the file is deleted or replaced under an open connection: commits went
//! on into the log, answered as stored, checkpoints copied them into a file no path names any
//! more and started the log over, and everything went with that file when the process ended.

use std::path::{Path, PathBuf};

use crate::checkpoint::SyncFailed;

/// The file a store opened, by identity, and the latch that stops checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    path: PathBuf,
    /// Device and inode at open; `None` where the platform has no such identity, or the
    /// file could not be read then (nothing is compared).
    identity: Option<(u64, u64)>,
    stop: SyncFailed,
}

impl Opened {
    /// The file at `path` now, which the store has just opened.
    pub(crate) fn at(path: &Path, stop: SyncFailed) -> Opened {
        Opened {
            path: path.to_owned(),
            identity: identity(path).ok(),
            stop,
        }
    }

    /// Why the store must commit nothing more, when the file at its path is no longer the one
    /// it opened (deleted, moved away, replaced by a copy). Checkpoints stop then, once and for
    /// good: the log at the path keeps every commit, and the next open refuses a missing
    /// database beside it (`OpenError::LostDatabase`) rather than starting empty.
    pub(crate) fn moved(&self) -> Option<String> {
        let opened = self.identity?;
        let why = match identity(&self.path) {
            Ok(now) if now == opened => return None,
            Ok(_) => "was replaced by another file",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "was deleted or moved away",
            // Unreadable for another reason (permissions changed, an I/O error): not proof
            // of a move, and the commit's own errors say the rest.
            Err(_) => return None,
        };
        let why = format!(
            "the database file {} {why} while the store had it open: nothing more is \
             committed and the write-ahead log keeps what was; restore the file and restart",
            self.path.display()
        );
        if self.stop.trip() {
            tracing::error!("{why}");
        }
        Some(why)
    }
}

#[cfg(unix)]
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_: &Path) -> std::io::Result<(u64, u64)> {
    Err(std::io::ErrorKind::Unsupported.into())
}
