//! What a handler's transaction helpers report, the same on every backend: whether an action key
//! was taken now, whether an outbox message was queued, and where an offset stands against its
//! watermark.

/// Whether an action key was taken now or already by an earlier event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Once {
    /// This event is the first to ask: perform the action.
    First,
    /// Another event already performed it: skip.
    Already,
}

/// Whether `enqueue` queued its message. A key names one message for its destination: a second
/// under the same key is not queued, and says whether it was the same message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "`Conflict` is `Ok` and means the message was not queued"]
pub enum Enqueued {
    /// Queued now: delivered after the commit.
    Queued,
    /// The same message (payload and content type) was queued under this key before.
    Already,
    /// Another message was queued under this key before: it stands, and this one is not
    /// queued. Usually a key built from too little (the order, where it should be the order
    /// and the kind of message).
    Conflict,
}

/// Where an offset stands against the stream's watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "`Replay` means the message was processed already"]
pub enum OffsetMove {
    Advanced,
    /// At or below the watermark: a replay of a message already processed.
    Replay,
}

/// A name an action key, an entity version or an offset watermark is kept under holds a NUL
/// byte: PostgreSQL cannot store one (it failed there as the handler's SQL error while SQLite
/// kept it), so no backend takes it, and the handler fails the same way on each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} holds a NUL byte, which no store keeps")]
pub struct NulInName {
    /// Which name: `action scope`, `action key`, `entity`, `entity id` or `stream`.
    pub what: &'static str,
}

/// Refuses the first of `names` (what each is, and its value) that holds a NUL byte.
pub fn check_names(names: &[(&'static str, &str)]) -> Result<(), NulInName> {
    match names.iter().find(|(_, value)| value.contains('\0')) {
        Some((what, _)) => Err(NulInName { what }),
        None => Ok(()),
    }
}
