//! What a consumer makes of the store's answer to one message: acknowledge, quarantine with a
//! reason, or requeue after a wait; and which of those its log hears of at warn.

use crate::fingerprint::PayloadError;
use crate::outcome::{Invalid, ProcessError, Processed};

use super::{Reason, Requeue, RetryPolicy, Settle};

/// Decides from the store's answer. `attempt` is this delivery's number, from 1 (the broker's
/// delivery count where it has one).
///
/// Only a committed outcome is acknowledged (G3). `Unavailable` is requeued however often it
/// happens: the message is not at fault. Conflicts and invalid events are quarantined at once —
/// retrying cannot change them, and requeueing would loop forever.
pub fn decide(outcome: Result<Processed, ProcessError>, attempt: u32, p: &RetryPolicy) -> Settle {
    let requeue = |why, after| Settle::Requeue { why, after };
    match outcome {
        Ok(done) => Settle::Ack(done),
        Err(ProcessError::Conflict { stored, offered }) => {
            Settle::Quarantine(Reason::KeyReused { stored, offered })
        }
        // The store's refusals the gateway answers by their own problem types carry them here
        // too, so a quarantined copy's reason reads as the webhook's answer would.
        Err(ProcessError::Invalid(Invalid::Payload(PayloadError::Json(e)))) => {
            Settle::Quarantine(Reason::InvalidJson(e.to_string()))
        }
        Err(ProcessError::Invalid(Invalid::TooLarge { size, limit })) => {
            Settle::Quarantine(Reason::EventTooLarge { size, limit })
        }
        Err(ProcessError::Invalid(Invalid::Key(e))) => {
            Settle::Quarantine(Reason::EventIdInvalid(e.to_string()))
        }
        Err(ProcessError::Invalid(e)) => Settle::Quarantine(Reason::Invalid(e.to_string())),
        Err(ProcessError::InProgress { retry_after }) => {
            requeue(Requeue::InProgress, retry_after.max(p.delay))
        }
        Err(ProcessError::Uncertain) => requeue(Requeue::Uncertain, p.uncertain_delay),
        Err(ProcessError::Handler(e)) if attempt >= p.max_attempts => {
            Settle::Quarantine(Reason::HandlerFailed {
                attempts: attempt,
                error: e.to_string(),
            })
        }
        Err(ProcessError::Handler(_)) => requeue(Requeue::HandlerFailed, p.delay),
        // `Unavailable` and anything a newer store may add: requeue, never ack.
        Err(_) => requeue(Requeue::Unavailable, p.delay),
    }
}

/// What a consumer says of an outcome it does not settle, in a line for its log at warn level,
/// or `None` when it says nothing there: a handler's failure with its attempt (it is requeued
/// until its attempts run out, then quarantined with the last error); a store that cannot
/// answer, at most once a minute in the process (every message in hand hits the same outage,
/// and a long outage must not fill the log, nor pass unseen at the default level).
pub fn worth_a_warning(outcome: &Result<Processed, ProcessError>, attempt: u32) -> Option<String> {
    match outcome {
        Err(ProcessError::Handler(e)) => Some(format!(
            "handler failed at attempt {attempt}, the message is requeued: {e}"
        )),
        Err(e @ ProcessError::Unavailable(_)) if outage_notice_due() => Some(format!(
            "store unavailable, messages are held and tried again (said once a minute): {e}"
        )),
        _ => None,
    }
}

/// Whether a minute passed since the last outage notice, in this process.
fn outage_notice_due() -> bool {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    // Seconds since START, plus one, of the last notice; 0 before the first.
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
        + 1;
    let last = LAST.load(Ordering::Relaxed);
    (last == 0 || now >= last + 60)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::JsonError;

    /// A refusal the gateway answers by a problem type of its own is quarantined under that
    /// slug, not the catch-all `invalid`.
    #[test]
    fn a_store_refusal_keeps_the_gateways_problem_type() {
        let p = RetryPolicy::default();
        let slug = |e: Invalid| match decide(Err(ProcessError::Invalid(e)), 1, &p) {
            Settle::Quarantine(reason) => (reason.slug(), reason.detail()),
            other => panic!("not quarantined: {other:?}"),
        };
        let json = Invalid::Payload(PayloadError::Json(JsonError::Syntax { offset: 3 }));
        assert_eq!(
            slug(json),
            ("invalid-json", "JSON syntax error at byte 3".to_owned())
        );
        let blank = Invalid::Key(crate::InvalidKey::EventIdBlank);
        assert_eq!(slug(blank).0, "event-id-invalid");
        // The store counts the headers too, which its detail says.
        let large = Invalid::TooLarge {
            size: 2_000,
            limit: 1_000,
        };
        assert_eq!(
            slug(large),
            (
                "body-too-large",
                "the event is 2000 bytes with its headers; the store keeps at most 1000".to_owned()
            )
        );
        let missing = Invalid::Payload(PayloadError::NoFields);
        assert_eq!(slug(missing).0, "invalid");
    }
}
