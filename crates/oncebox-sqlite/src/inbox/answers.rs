//! How `Inbox` answers a duplicate without the writer: from the memory of recent first
//! answers, from a reader look while looks pay, or from a reader when the writer cannot answer.

use std::sync::atomic::Ordering;

use oncebox_core::{Event, Fingerprint, Key, ProcessError, Processed, Response, Unavailable};

use super::Inbox;
use crate::read;

/// What `committed_duplicate` did.
pub(crate) enum Look {
    /// A committed duplicate: its first answer.
    Found(Response),
    /// Looked, and the key is not committed with this fingerprint.
    Missed,
    /// Did not look: looks do not pay at the moment.
    Skipped,
}

impl Inbox {
    /// When the writer cannot answer (the file locked by another process, a deadline passed
    /// before the request ran), a key already committed is still answered from its record on a
    /// reader connection. Only then: reading first for every event cost new keys, the common
    /// case for consumers, a read transaction each (8% of the consumer benchmark's
    /// instructions), and the writer answers duplicates from the same record. Not when the
    /// request's own commit may have happened (`CommitUnknown`: a failed COMMIT, a deadline
    /// passed while it ran): the record read could be its own, and its handler ran.
    pub(crate) fn or_committed(
        &self,
        out: Result<Processed, ProcessError>,
        key: &Key,
        fingerprint: &Fingerprint,
    ) -> Result<Processed, ProcessError> {
        match out {
            Err(ProcessError::Unavailable(why))
                if !matches!(why, Unavailable::CommitUnknown(_)) =>
            {
                match self.committed_answer(key, fingerprint) {
                    Some(first) => Ok(Processed::Duplicate(first)),
                    None => Err(ProcessError::Unavailable(why)),
                }
            }
            other => other,
        }
    }

    /// The first response of a key already committed with `fingerprint`, read on a reader
    /// connection. A reader sees only committed records, so this is a duplicate answer G3
    /// allows. Anything else — no record, another fingerprint (the conflict must be recorded),
    /// a lease, an error — is `None`.
    pub(super) fn committed_answer(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
    ) -> Option<Response> {
        let found = self
            .shared
            .readers
            .look(|c| read::committed(c, key))
            .ok()??;
        (found.0 == fingerprint.as_bytes()[..]).then_some(found.1)
    }

    /// `committed_answer` before the writer, for the gateway's ingest: duplicates, the most
    /// common webhook retry, skip the writer queue. Looks only while looks pay (`ProbeGate`):
    /// `Skipped` sends the event to the writer, which answers a duplicate too, and whose
    /// answer is then told to the gate with [`Inbox::skipped_look`].
    pub(crate) fn committed_duplicate(&self, event: &Event) -> Look {
        // Not told to the gate: it weighs looks for the duplicates memory does not hold.
        if let Some(first) = self.remembered(event) {
            return Look::Found(first);
        }
        if !self.shared.probe.look() {
            return Look::Skipped;
        }
        let found = self.committed_answer(&event.key, &event.fingerprint);
        self.shared.probe.found(found.is_some());
        found.map_or(Look::Missed, Look::Found)
    }

    /// The memory of recent answers' generation, read before a request looks its key up
    /// (`Recent::generation`), for [`Inbox::settled`].
    pub(crate) fn recent_generation(&self) -> u64 {
        self.shared.recent.generation()
    }

    /// The committed first answer of a recent key with this fingerprint (`recent.rs`).
    fn remembered(&self, event: &Event) -> Option<Response> {
        let first = self.shared.recent.get(&event.key, &event.fingerprint)?;
        self.shared
            .stats
            .from_memory
            .fetch_add(1, Ordering::Relaxed);
        Some(first)
    }

    /// Remembers the first answer of `key` when `out` came from its committed record (applied
    /// by this request, or its duplicate) and no purge forgot everything since the request
    /// began (`since`, the memory's generation then), and passes `out` on.
    pub(crate) fn settled(
        &self,
        out: Result<Processed, ProcessError>,
        key: &Key,
        fingerprint: Fingerprint,
        since: u64,
    ) -> Result<Processed, ProcessError> {
        if let Ok(Processed::Applied(answer) | Processed::Duplicate(answer)) = &out {
            self.shared.recent.put(key, fingerprint, answer, since);
        }
        out
    }

    /// What the writer answered a request whose look was skipped: a duplicate there is a look
    /// that would have paid. A failure tells nothing about the keys and is not counted.
    pub(crate) fn skipped_look(&self, out: &Result<Processed, ProcessError>) {
        if let Ok(processed) = out {
            self.shared
                .probe
                .found(matches!(processed, Processed::Duplicate(_)));
        }
    }
}
