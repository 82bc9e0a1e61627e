//! `[storage]`: tuning of the store every command opens: the size of the SQLite inbox's
//! memory of recent first answers (for the commands that take events), and the CPU its writer
//! and checkpointer are kept on.

use oncebox_sqlite::Placement;
use serde::Deserialize;

use super::Problems;

/// Most answers the memory may be asked to keep: about 250 bytes each, so 2.5 GB.
const MAX_RECENT_ANSWERS: usize = oncebox_sqlite::MAX_RECENT_ANSWERS;

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
        Some(RawPlacement::Cpu(cpu)) => {
            if let Some(allowed) = allowed_cpus()
                && !allowed.iter().any(|(lo, hi)| (*lo..=*hi).contains(cpu))
            {
                // A warning, not a refusal: the store still works, only unpinned, and the
                // configuration may be checked on another machine than the one it runs on.
                warnings.push(format!(
                    "storage.placement = {cpu}: this process may run only on CPUs {}; the \
                     kernel refuses the pin and the writer runs wherever the scheduler puts it",
                    allowed
                        .iter()
                        .map(|(lo, hi)| if lo == hi {
                            lo.to_string()
                        } else {
                            format!("{lo}-{hi}")
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
            Some(Placement::Cpu(*cpu))
        }
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

/// The CPUs this process may run on, as ranges (Linux's `Cpus_allowed_list`); `None` where
/// the system does not say.
fn allowed_cpus() -> Option<Vec<(usize, usize)>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    cpu_list(list.trim())
}

/// `0-3,5,7-8` as ranges.
fn cpu_list(list: &str) -> Option<Vec<(usize, usize)>> {
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => part.parse().ok().map(|n| (n, n)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_read_as_ranges() {
        assert_eq!(
            super::cpu_list("0-3,5,7-8"),
            Some(vec![(0, 3), (5, 5), (7, 8)])
        );
        assert_eq!(super::cpu_list("0"), Some(vec![(0, 0)]));
        assert_eq!(super::cpu_list("x"), None);
    }
}
