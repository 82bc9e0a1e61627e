//! What a handler's transaction helpers report, the same on every backend: whether an action key
//! was taken now, and where an offset stands against its watermark.

/// Whether an action key was taken now or already by an earlier event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Once {
    /// This event is the first to ask: perform the action.
    First,
    /// Another event already performed it: skip.
    Already,
}

/// Where an offset stands against the stream's watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OffsetMove {
    Advanced,
    /// At or below the watermark: a replay of a message already processed.
    Replay,
}
