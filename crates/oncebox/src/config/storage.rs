//! `[storage]`: tuning of the store `oncebox serve` opens: the size of the SQLite inbox's
//! memory of recent first answers, and the CPU its writer and checkpointer are kept on.

use oncebox_sqlite::Placement;
use serde::Deserialize;

use super::Problems;

/// Most answers the memory may be asked to keep: about 250 bytes each, so 2.5 GB.
const MAX_RECENT_ANSWERS: usize = 10_000_000;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    pub recent_answers: Option<usize>,
    pub placement: Option<RawPlacement>,
}

/// `placement = "disk-interrupts"`, `"anywhere"` or a CPU number.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "\"disk-interrupts\", \"anywhere\" or a CPU number (0 or more)"
)]
pub(super) enum RawPlacement {
    Cpu(usize),
    Named(String),
}

/// How the store is opened, past its URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Storage {
    /// First answers of recently committed keys kept in memory (SQLite), so that a prompt
    /// retry is answered without a read; `None` keeps the library's default, 0 turns it off.
    pub recent_answers: Option<usize>,
    /// Which CPU the SQLite writer and checkpointer are kept on; `None` keeps the library's
    /// default (the CPU taking the disk's interrupts, where one takes them all).
    pub placement: Option<Placement>,
}

pub(super) fn validate(
    raw: &RawStorage,
    database: &str,
    p: &mut Problems<'_>,
    warnings: &mut Vec<String>,
) -> Storage {
    if raw.recent_answers.is_some() && crate::store::is_postgres(database) {
        warnings.push(
            "storage.recent_answers is for SQLite: the PostgreSQL store keeps no answers in memory"
                .to_owned(),
        );
    }
    if raw.recent_answers.is_some_and(|n| n > MAX_RECENT_ANSWERS) {
        p.push(
            "storage.recent_answers",
            format_args!("must be at most {MAX_RECENT_ANSWERS} (about 250 bytes of memory each)"),
        );
    }
    if raw.placement.is_some() && crate::store::is_postgres(database) {
        warnings.push(
            "storage.placement is for SQLite: the PostgreSQL store runs no writer thread"
                .to_owned(),
        );
    }
    let placement = match &raw.placement {
        None => None,
        Some(RawPlacement::Cpu(cpu)) => Some(Placement::Cpu(*cpu)),
        Some(RawPlacement::Named(name)) => match name.as_str() {
            "disk-interrupts" => Some(Placement::DiskInterrupts),
            "anywhere" => Some(Placement::Anywhere),
            _ => {
                p.push(
                    "storage.placement",
                    format_args!("{name:?}: use \"disk-interrupts\", \"anywhere\" or a CPU number"),
                );
                None
            }
        },
    };
    Storage {
        recent_answers: raw.recent_answers,
        placement,
    }
}
