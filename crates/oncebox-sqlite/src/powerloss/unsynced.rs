//! The writes to one file the power-loss VFS holds until a sync: what a read sees through
//! them, what a sync writes out, and what a failed sync drops.

use std::collections::BTreeMap;

/// Writes to one file not yet synced, by offset and then by order: a later write over the
/// same bytes wins.
#[derive(Default)]
pub(super) struct Unsynced {
    writes: BTreeMap<(i64, u64), Vec<u8>>,
    order: u64,
    /// The longest write, to find those that overlap a range.
    longest: i64,
    /// The end of the furthest write.
    pub(super) end: i64,
    /// Writes ordered before this were dropped by a failed sync: read, never persisted.
    lost: u64,
    /// Failed syncs of the file so far.
    pub(super) errors: u64,
}

impl Unsynced {
    /// Copies over `out`, read from the file at `at`, the held writes that overlap it, oldest
    /// first so that a later write over the same bytes wins.
    pub(super) fn overlay(&self, at: i64, out: &mut [u8]) {
        let end = at.saturating_add(len(out));
        let mut overlapping: Vec<(&(i64, u64), &Vec<u8>)> = self
            .writes
            .range((at.saturating_sub(self.longest), 0)..(end, 0))
            .filter(|((offset, _), bytes)| offset.saturating_add(len(bytes)) > at)
            .collect();
        overlapping.sort_by_key(|((_, order), _)| *order);
        for ((offset, _), bytes) in overlapping {
            let from = at.max(*offset);
            let to = end.min(offset.saturating_add(len(bytes)));
            let (src, dst) = (index(from - offset), index(from - at));
            let count = index(to - from);
            out[dst..dst + count].copy_from_slice(&bytes[src..src + count]);
        }
    }

    /// Holds `bytes` written at `at`.
    pub(super) fn record(&mut self, at: i64, bytes: Vec<u8>) {
        let end = at.saturating_add(len(&bytes));
        self.overwrite_lost(at, end);
        self.longest = self.longest.max(len(&bytes));
        self.end = self.end.max(end);
        let order = self.order;
        self.order += 1;
        self.writes.insert((at, order), bytes);
    }

    /// Takes `at..end` out of every write a failed sync dropped: the page cache holds the new
    /// bytes there, and a sync persists them. Kept whole, a lost write would lie over them once
    /// they were synced (and no longer held), and reads would return the lost bytes. A log's
    /// lost writes are covered in part: SQLite writes a failed commit's frames again at the same
    /// place, but a retry's commit may be shorter or longer, and the log's appends are gathered
    /// into one write per commit (`walvfs.rs`). What a lost write keeps outside `at..end` stays
    /// lost. The page cache works in pages and would persist the lost bytes that share a page
    /// with the new write; losing them too is the harsher case, and for a log only drops more
    /// of a commit SQLite never published.
    fn overwrite_lost(&mut self, at: i64, end: i64) {
        let lost = self.lost;
        let hit: Vec<(i64, u64)> = self
            .writes
            .range((at.saturating_sub(self.longest), 0)..(end, 0))
            .filter(|((offset, order), old)| *order < lost && offset.saturating_add(len(old)) > at)
            .map(|(key, _)| *key)
            .collect();
        for (offset, order) in hit {
            let Some(old) = self.writes.remove(&(offset, order)) else {
                continue;
            };
            let old_end = offset.saturating_add(len(&old));
            if offset < at {
                self.writes
                    .insert((offset, order), old[..index(at - offset)].to_vec());
            }
            if old_end > end {
                self.writes
                    .insert((end, order), old[index(end - offset)..].to_vec());
            }
        }
    }

    /// Cuts what is held at `size`, the file having been truncated there.
    pub(super) fn truncate(&mut self, size: i64) {
        self.writes.retain(|(offset, _), _| *offset < size);
        for ((offset, _), bytes) in &mut self.writes {
            bytes.truncate(index(size - offset));
        }
        self.end = self.end.min(size);
    }

    /// Whether any write is held.
    pub(super) fn any(&self) -> bool {
        !self.writes.is_empty()
    }

    /// A failed sync: every write held so far stays readable and is never persisted.
    pub(super) fn lose_all(&mut self) {
        self.lost = self.order;
        self.errors += 1;
    }

    /// What a sync writes out, in the order it was written: offsets and bytes.
    pub(super) fn to_persist(&self) -> Vec<(i64, &[u8])> {
        let mut ordered: Vec<(&(i64, u64), &Vec<u8>)> = self
            .writes
            .iter()
            .filter(|((_, order), _)| *order >= self.lost)
            .collect();
        ordered.sort_by_key(|((_, order), _)| *order);
        ordered
            .into_iter()
            .map(|((offset, _), bytes)| (*offset, bytes.as_slice()))
            .collect()
    }

    /// The sync that wrote out [`Unsynced::to_persist`] succeeded.
    pub(super) fn persisted(&mut self) {
        // What a failed sync dropped stays readable (the page cache), never persisted.
        let lost = self.lost;
        self.writes.retain(|(_, order), _| *order < lost);
        if self.writes.is_empty() {
            (self.longest, self.end) = (0, 0);
        }
    }
}

fn len(bytes: &[u8]) -> i64 {
    i64::try_from(bytes.len()).unwrap_or(i64::MAX)
}

fn index(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::Unsynced;

    /// What a sync leaves on `disk`: the writes it persists, in order.
    fn sync(u: &mut Unsynced, disk: &mut Vec<u8>) {
        for (offset, bytes) in u.to_persist() {
            let at = usize::try_from(offset).unwrap();
            if disk.len() < at + bytes.len() {
                disk.resize(at + bytes.len(), 0);
            }
            disk[at..at + bytes.len()].copy_from_slice(bytes);
        }
        u.persisted();
    }

    /// What a read of `disk` through the held writes sees.
    fn read(u: &Unsynced, disk: &[u8]) -> Vec<u8> {
        let mut out = disk.to_vec();
        u.overlay(0, &mut out);
        out
    }

    /// A failed sync's write, then a shorter one over its start that is synced: reads see the
    /// new bytes where they were written (the page cache took them) and the lost ones after
    /// them; the disk has the new bytes and never the lost ones.
    #[test]
    fn a_later_write_over_part_of_a_lost_one_wins_once_synced() {
        let mut disk = vec![b'.'; 12];
        let mut u = Unsynced::default();
        u.record(2, b"LLLLLLLL".to_vec());
        u.lose_all();
        u.record(4, b"nn".to_vec());
        sync(&mut u, &mut disk);
        assert_eq!(disk, b"....nn......");
        assert_eq!(read(&u, &disk), b"..LLnnLLLL..");
        // A later write after the lost bytes' end, synced as well.
        u.record(8, b"mmmm".to_vec());
        sync(&mut u, &mut disk);
        assert_eq!(disk, b"....nn..mmmm");
        assert_eq!(read(&u, &disk), b"..LLnnLLmmmm");
        // Covered whole, the lost write is gone.
        u.record(0, b"wwwwwwwwwwww".to_vec());
        sync(&mut u, &mut disk);
        assert_eq!(disk, b"wwwwwwwwwwww");
        assert_eq!(read(&u, &disk), b"wwwwwwwwwwww");
        assert!(
            !u.any(),
            "nothing is held once every lost byte was written again"
        );
    }
}
