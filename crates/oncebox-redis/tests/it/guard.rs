//! The pattern of the crate docs — Redis in front, the SQL inbox's durable lease as the final
//! guard — with the external effect counted and what Redis said kept for the checks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use oncebox_core::{Begun, Event, Lease, LeaseError, ProcessError, Response};
use oncebox_redis::Leases;
use oncebox_sqlite::{Inbox, Record};

pub const TTL: Duration = Duration::from_secs(30);

/// The external effect: one count per call, per key.
#[derive(Debug, Default)]
pub struct Receiver(Mutex<HashMap<String, usize>>);

impl Receiver {
    pub fn send(&self, event: &Event) -> Response {
        *self
            .0
            .lock()
            .unwrap()
            .entry(event.key.to_string())
            .or_default() += 1;
        Response::completed(format!("receipt for {}", event.key))
    }

    pub fn effects(&self, event: &Event) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(&event.key.to_string())
            .copied()
            .unwrap_or(0)
    }
}

/// What Redis answered `begin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisSaw {
    Leased(i64),
    Duplicate,
    Unavailable,
    Other(String),
}

/// How one delivery ended, as the caller (a webhook handler, a consumer) would answer.
#[derive(Debug)]
pub enum Answer {
    Applied(Response),
    Duplicate(Response),
    /// Not now: in progress elsewhere, or a store unavailable. Nack, retry later.
    NotNow(String),
}

/// One delivery through the whole pattern, and what Redis answered its `begin`.
pub async fn deliver(
    redis: &Leases,
    inbox: &Inbox,
    receiver: &Receiver,
    event: &Event,
) -> (Answer, RedisSaw) {
    let (fast, saw) = match redis.begin(event, TTL).await {
        // Cached after an inbox commit: a committed fact.
        Ok(Begun::Duplicate(first)) => return (Answer::Duplicate(first), RedisSaw::Duplicate),
        Ok(Begun::Leased(lease)) => {
            let token = lease.token;
            (Some(lease), RedisSaw::Leased(token))
        }
        // Redis down: the inbox alone decides.
        Err(ProcessError::Unavailable(_)) => (None, RedisSaw::Unavailable),
        // Another payload under the key: the inbox records it (G4) and answers it; Redis
        // keeps no audit.
        Err(ProcessError::Conflict { .. }) => (None, RedisSaw::Other("conflict".into())),
        other => {
            let why = format!("{other:?}");
            return (Answer::NotNow(why.clone()), RedisSaw::Other(why));
        }
    };
    (
        guarded(redis, inbox, receiver, event, fast.as_ref()).await,
        saw,
    )
}

/// Steps two and three: the inbox's lease, the effect, the inbox's completion, then Redis's.
pub async fn guarded(
    redis: &Leases,
    inbox: &Inbox,
    receiver: &Receiver,
    event: &Event,
    fast: Option<&Lease>,
) -> Answer {
    let lease = match inbox.begin(event.clone(), TTL).await {
        Ok(Begun::Leased(lease)) => lease,
        answer => {
            if let Some(fast) = fast {
                let _ = redis.release(fast).await;
                // Done before, and Redis had forgotten: cached from the record's completion.
                // Redis's `complete` would keep it a whole retention from now, past the record.
                if let Ok(Begun::Duplicate(first)) = &answer {
                    remember(redis, inbox, event, first).await;
                }
            }
            return match answer {
                Ok(Begun::Duplicate(first)) => Answer::Duplicate(first),
                other => Answer::NotNow(format!("{other:?}")),
            };
        }
    };
    // An earlier holder's lease ended unfinished: its receipt may have gone out, and this
    // receiver checks no token. Parked for an operator rather than sent a second time.
    if lease.taken_over {
        inbox.uncertain(&lease).await.expect("park the key");
        if let Some(fast) = fast {
            let _ = redis.release(fast).await;
        }
        return Answer::NotNow("parked uncertain".into());
    }
    let response = receiver.send(event);
    finish(redis, inbox, &lease, fast, &response).await;
    Answer::Applied(response)
}

/// Caches a duplicate's answer until its inbox record's retention ends; a cache, so a refusal
/// or an outage changes nothing.
async fn remember(redis: &Leases, inbox: &Inbox, event: &Event, first: &Response) {
    let record = inbox.record(&event.key).await;
    if let Ok(Some(Record {
        completed_at: Some(at),
        ..
    })) = record
    {
        let _ = redis.remember(event, first, at).await;
    }
}

/// The inbox first, so Redis only ever says "done" about a committed key; Redis's refusal
/// (fenced, forgotten, down) changes nothing, it is only a cache. Returns what Redis said.
pub async fn finish(
    redis: &Leases,
    inbox: &Inbox,
    lease: &Lease,
    fast: Option<&Lease>,
    response: &Response,
) -> Option<Result<(), LeaseError>> {
    inbox
        .complete(lease, response.clone())
        .await
        .expect("the inbox lease outlives this test's effect");
    match fast {
        Some(fast) => Some(redis.complete(fast, response).await),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{Namespace, event, shared};

    /// A conflicting payload that Redis refuses still reaches the inbox, which records it for
    /// the audit and answers it as a conflict; nothing is sent.
    #[test]
    fn a_conflict_refused_by_redis_is_recorded_by_the_inbox() {
        let Some(url) = shared() else { return };
        oncebox_testkit::run(async move {
            let ns = Namespace::new(&url);
            let redis = ns.leases().await;
            let dir = tempfile::tempdir().unwrap();
            let options = oncebox_sqlite::Options::new(dir.path().join("inbox.db"));
            let inbox = Inbox::open(options).unwrap();
            let receiver = Receiver::default();
            let (first, other) = (event("order-1", 1), event("order-1", 2));
            let (answer, _) = deliver(&redis, &inbox, &receiver, &first).await;
            assert!(matches!(answer, Answer::Applied(_)), "{answer:?}");
            let (answer, saw) = deliver(&redis, &inbox, &receiver, &other).await;
            assert_eq!(saw, RedisSaw::Other("conflict".into()), "Redis refused it");
            assert!(
                matches!(&answer, Answer::NotNow(why) if why.contains("Conflict")),
                "{answer:?}"
            );
            let recorded: i64 = inbox
                .read(|c| c.query_row("SELECT count(*) FROM oncebox_conflicts", [], |r| r.get(0)))
                .await
                .unwrap();
            assert_eq!(recorded, 1, "the inbox keeps the conflicting payload");
            assert_eq!(receiver.effects(&first), 1);
        });
    }
}
