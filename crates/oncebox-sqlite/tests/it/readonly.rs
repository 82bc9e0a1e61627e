//! A database file the process may not write opens read-only without a word from SQLite: the
//! store would then answer every event unavailable while its readiness check, which writes
//! nothing, said ready. The open refuses it, naming the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use oncebox_sqlite::{Inbox, OpenError, Options};

/// Makes `file` unwritable for this process while it lives: its mode, and where that does not
/// stop the process (root), the immutable attribute, taken off again on drop, or the test's
/// directory could not be removed.
struct Unwritable {
    file: PathBuf,
    immutable: bool,
}

impl Unwritable {
    fn new(file: &Path) -> Unwritable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444)).unwrap();
        let immutable = writable(file);
        if immutable {
            chattr("+i", file);
        }
        Unwritable {
            file: file.to_owned(),
            immutable,
        }
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        if self.immutable {
            chattr("-i", &self.file);
        }
    }
}

fn writable(file: &Path) -> bool {
    std::fs::OpenOptions::new().append(true).open(file).is_ok()
}

fn chattr(flag: &str, file: &Path) {
    let status = Command::new("chattr").arg(flag).arg(file).status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "chattr {flag} {}: the file system must take file attributes",
        file.display()
    );
}

#[test]
fn a_file_this_process_cannot_write_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    drop(Inbox::open(Options::new(&path)).unwrap());
    let unwritable = Unwritable::new(&path);
    // The fault is in place: the file cannot be opened for writing.
    assert!(!writable(&path), "{} is still writable", path.display());
    match Inbox::open(Options::new(&path)) {
        Err(e @ OpenError::ReadOnly { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
        }
        Err(other) => panic!("expected ReadOnly, got {other}"),
        Ok(_) => panic!("a read-only file opened as a store"),
    }
    drop(unwritable);
    // Writable again, it opens as before: nothing was changed by the refusal.
    drop(Inbox::open(Options::new(&path)).unwrap());
}
