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
        // A write a failed sync dropped, covered whole by this one, is gone from the page
        // cache too: kept, it would lie over this write's bytes once they were synced. Only
        // database files lose writes, and SQLite writes their pages whole, so a lost write is
        // never covered in part.
        let (lost, end) = (self.lost, at.saturating_add(len(&bytes)));
        self.writes.retain(|(offset, order), old| {
            *order >= lost || *offset < at || offset.saturating_add(len(old)) > end
        });
        self.longest = self.longest.max(len(&bytes));
        self.end = self.end.max(end);
        let order = self.order;
        self.order += 1;
        self.writes.insert((at, order), bytes);
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
