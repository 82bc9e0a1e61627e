//! Which pull errors the consumer goes on after: the client's message stream outlives a missed
//! heartbeat, a `no responders` or a failed pull request (the server restarting, a network
//! stall, JetStream electing a leader), so ending `run` on them would make every caller
//! reconnect for a hiccup. After each, pulling starts afresh: the client's own stream may not
//! ask again before its pull request expires. A stretch of them with no message between ends
//! `run`, so that the caller binds again, and the setup's checks say what is wrong if something
//! is.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::Stream;

/// The durable's messages, `limit` per pull request, each request renewed before `expires`
/// and watched by `heartbeat`.
pub(crate) async fn messages(
    consumer: &PullConsumer,
    limit: usize,
    heartbeat: Duration,
    expires: Duration,
) -> Result<Stream, String> {
    consumer
        .stream()
        .max_messages_per_batch(limit)
        .heartbeat(heartbeat)
        .expires(expires)
        .messages()
        .await
        .map_err(|e| e.to_string())
}

/// Errors in one stretch that end `run`. A stalled connection misses a heartbeat every two
/// heartbeats, so with the default 5 s this is about 50 s of silence.
pub(crate) const MOST_IN_A_ROW: u32 = 5;

/// A pull error this long after the last one starts a new stretch: a `no responders` comes
/// back only when the pull request is renewed, 35 s after the last (its 30 s expiry and the
/// client's 5 s margin), and still belongs to the same trouble.
const STRETCH_GAP: Duration = Duration::from_secs(60);

/// Pull errors since the last message.
#[derive(Debug, Default)]
pub(crate) struct Trouble {
    in_a_row: u32,
    last: Option<Instant>,
}

impl Trouble {
    /// Counts an error at `now` and returns how many the current stretch holds.
    pub(crate) fn note(&mut self, now: Instant) -> u32 {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > STRETCH_GAP)
        {
            self.in_a_row = 0;
        }
        self.in_a_row += 1;
        self.last = Some(now);
        self.in_a_row
    }

    /// A message arrived: pulling works.
    pub(crate) fn clear(&mut self) {
        *self = Trouble::default();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{STRETCH_GAP, Trouble};

    #[test]
    fn a_stretch_counts_errors_until_a_message_or_a_long_quiet() {
        let t0 = Instant::now();
        let mut t = Trouble::default();
        assert_eq!(t.note(t0), 1);
        assert_eq!(t.note(t0 + Duration::from_secs(35)), 2);
        t.clear();
        assert_eq!(t.note(t0 + Duration::from_secs(40)), 1);
        let later = t0 + Duration::from_secs(40) + STRETCH_GAP + Duration::from_secs(1);
        assert_eq!(
            t.note(later),
            1,
            "an error long after the last starts afresh"
        );
    }
}
