//! Delivery policy without IO: how one attempt's result is classified, and what the relay does
//! next — delivered, retry after a backoff with full jitter, parked as uncertain, or dead.

use std::fmt;
use std::time::Duration;

/// A delivery's life (DESIGN §2). Stored by name; do not rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeliveryState {
    Pending,
    InFlight,
    Delivered,
    Retrying,
    Uncertain,
    Dead,
}

impl DeliveryState {
    /// Every state's stored name, in the order of a delivery's life: what listings and the CLI
    /// accept.
    pub const NAMES: [&'static str; 6] = [
        DeliveryState::Pending.as_str(),
        DeliveryState::InFlight.as_str(),
        DeliveryState::Delivered.as_str(),
        DeliveryState::Retrying.as_str(),
        DeliveryState::Uncertain.as_str(),
        DeliveryState::Dead.as_str(),
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::InFlight => "in_flight",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Uncertain => "uncertain",
            DeliveryState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "in_flight" => DeliveryState::InFlight,
            "delivered" => DeliveryState::Delivered,
            "retrying" => DeliveryState::Retrying,
            "uncertain" => DeliveryState::Uncertain,
            "dead" => DeliveryState::Dead,
            _ => return None,
        })
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one attempt produced, as the transport saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attempt {
    /// The receiver answered.
    Answered {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// The request never left (connection refused, DNS, TLS before sending): nothing happened
    /// at the receiver.
    NotSent(String),
    /// The request was sent and no answer came (timeout, reset): the receiver may or may not
    /// have applied it.
    NoAnswer(String),
}

/// Exponential backoff with full jitter: the wait before attempt `n + 1` is uniform in
/// `[0, min(cap, base × 2^n)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
        }
    }
}

impl Backoff {
    /// `jitter` in `[0, 1]` comes from the caller's random source, so this stays pure.
    pub fn delay(&self, attempts_made: u32, jitter: f64) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(2u32.saturating_pow(attempts_made.min(31)))
            .min(self.cap);
        // A NaN from a broken random source must not panic `mul_f64`: wait the full ceiling.
        let jitter = if jitter.is_nan() {
            1.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        ceiling.mul_f64(jitter)
    }
}

/// How long and how often a route is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    /// Past this age a delivery that still fails is dead (default three days, like the
    /// senders whose events oncebox relays).
    pub max_age: Duration,
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 15,
            max_age: Duration::from_secs(3 * 24 * 3600),
            backoff: Backoff::default(),
        }
    }
}

/// What the relay records after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    Delivered,
    /// Try again after this wait.
    Retry(Duration),
    /// The outcome is unknown and retrying could apply it twice: wait for reconciliation.
    Uncertain,
    Dead(String),
}

/// What recording a verdict writes on the delivery; `None` keeps the stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub state: &'static str,
    pub next_attempt_at: Option<i64>,
    pub delivered_at: Option<i64>,
    pub last_error: Option<String>,
}

impl Verdict {
    /// The delivery's new state and bookkeeping after an attempt whose error (if any) was
    /// `error`, at `now`; the same on every backend.
    pub fn recorded(&self, error: Option<&str>, now: crate::clock::Timestamp) -> Recorded {
        let error = error.map(str::to_owned);
        let (state, next_attempt_at, delivered_at, last_error) = match self {
            Verdict::Delivered => ("delivered", None, Some(now.millis()), error),
            Verdict::Retry(wait) => ("retrying", Some(now.plus(*wait).millis()), None, error),
            Verdict::Dead(reason) => (
                "dead",
                None,
                None,
                Some(error.unwrap_or_else(|| reason.clone())),
            ),
            // `Uncertain`: parking it for reconciliation neither claims an outcome nor risks a
            // second effect. Its status URL is first asked a while later: a receiver that
            // timed out is often still at work on the request, and asked at once would answer
            // "not applied" and have it sent again.
            Verdict::Uncertain => (
                "uncertain",
                Some(now.plus(crate::relay_store::STATUS_RECHECK.0).millis()),
                None,
                error,
            ),
        };
        Recorded {
            state,
            next_attempt_at,
            delivered_at,
            last_error,
        }
    }
}

/// Decides from one attempt. `attempts_made` counts this one; `age` is the delivery's age now.
///
/// 2xx is delivered. 3xx (not followed), 408, 425, 429, 5xx and a request that never left are retried (honouring
/// `Retry-After`, never waiting less than the backoff asks). Other 4xx are dead: the receiver
/// refuses the request itself. A request sent without an answer, or answered by a proxy's
/// gateway timeout (504, 524) that forwarded it, is retried only when the route honours the
/// idempotency key; otherwise it is uncertain. Attempts and age are capped.
pub fn decide(
    attempt: &Attempt,
    idempotent: bool,
    attempts_made: u32,
    age: Duration,
    policy: &RetryPolicy,
    jitter: f64,
) -> Verdict {
    let retryable = match attempt {
        Attempt::Answered { status, .. } if (200..300).contains(status) => {
            return Verdict::Delivered;
        }
        Attempt::Answered {
            status: 408 | 425 | 429,
            ..
        } => true,
        // A proxy's gateway timeout (504, Cloudflare's 524): it forwarded the request and its
        // upstream did not answer in time. The outcome is as unknown as after a timeout of
        // the relay's own, and sending again could apply it twice.
        Attempt::Answered {
            status: 504 | 524, ..
        } if !idempotent => return Verdict::Uncertain,
        Attempt::Answered { status, .. } if (500..600).contains(status) => true,
        // Redirects are not followed (the request would go where the route's owner did not
        // send it): a receiver that moved is a configuration to fix while retries last, not
        // a refusal of the request, and every delivery to it would die at once.
        Attempt::Answered { status, .. } if (300..400).contains(status) => true,
        Attempt::Answered { status, .. } => {
            return Verdict::Dead(format!("receiver answered {status}"));
        }
        Attempt::NotSent(_) => true,
        Attempt::NoAnswer(_) if idempotent => true,
        Attempt::NoAnswer(_) => return Verdict::Uncertain,
    };
    debug_assert!(retryable);
    if attempts_made >= policy.max_attempts {
        return Verdict::Dead(format!("gave up after {attempts_made} attempts"));
    }
    let backoff = policy
        .backoff
        .delay(attempts_made.saturating_sub(1), jitter);
    let wait = match attempt {
        Attempt::Answered {
            retry_after: Some(asked),
            ..
        } => backoff.max(*asked),
        _ => backoff,
    };
    if age.saturating_add(wait) > policy.max_age {
        return Verdict::Dead(format!(
            "older than {:?} before the next attempt",
            policy.max_age
        ));
    }
    Verdict::Retry(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        max_age: Duration::from_secs(3600),
        backoff: Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        },
    };

    fn answered(status: u16) -> Attempt {
        Attempt::Answered {
            status,
            retry_after: None,
        }
    }

    #[test]
    fn success_is_delivered_and_client_errors_are_dead() {
        for s in [200, 201, 204, 299] {
            assert_eq!(
                decide(&answered(s), false, 1, Duration::ZERO, &P, 0.5),
                Verdict::Delivered
            );
        }
        for s in [400, 401, 403, 404, 410, 422] {
            assert!(
                matches!(
                    decide(&answered(s), true, 1, Duration::ZERO, &P, 0.5),
                    Verdict::Dead(_)
                ),
                "{s}"
            );
        }
    }

    #[test]
    fn transient_answers_and_unsent_requests_are_retried() {
        for a in [
            answered(408),
            answered(425),
            answered(429),
            answered(500),
            answered(503),
            answered(301),
            answered(307),
            answered(308),
            Attempt::NotSent("refused".into()),
        ] {
            assert!(
                matches!(
                    decide(&a, false, 1, Duration::ZERO, &P, 1.0),
                    Verdict::Retry(_)
                ),
                "{a:?}"
            );
        }
    }

    #[test]
    fn no_answer_is_retried_only_when_the_route_is_idempotent() {
        let lost = Attempt::NoAnswer("timeout".into());
        assert!(matches!(
            decide(&lost, true, 1, Duration::ZERO, &P, 1.0),
            Verdict::Retry(_)
        ));
        assert_eq!(
            decide(&lost, false, 1, Duration::ZERO, &P, 1.0),
            Verdict::Uncertain
        );
        // A proxy that forwarded the request and timed out waiting says no more.
        for status in [504, 524] {
            let timed_out = answered(status);
            let retried = decide(&timed_out, true, 1, Duration::ZERO, &P, 1.0);
            assert!(matches!(retried, Verdict::Retry(_)), "{status}");
            let parked = decide(&timed_out, false, 1, Duration::ZERO, &P, 1.0);
            assert_eq!(parked, Verdict::Uncertain, "{status}");
        }
        let refused = decide(&answered(502), false, 1, Duration::ZERO, &P, 1.0);
        assert!(matches!(refused, Verdict::Retry(_)));
    }

    #[test]
    fn retry_after_is_honoured_as_a_minimum() {
        let a = Attempt::Answered {
            status: 429,
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(
            decide(&a, false, 1, Duration::ZERO, &P, 0.0),
            Verdict::Retry(Duration::from_secs(30))
        );
        let short = Attempt::Answered {
            status: 503,
            retry_after: Some(Duration::ZERO),
        };
        assert_eq!(
            decide(&short, false, 3, Duration::ZERO, &P, 1.0),
            Verdict::Retry(Duration::from_secs(4))
        );
    }

    #[test]
    fn backoff_is_exponential_capped_and_fully_jittered() {
        let b = P.backoff;
        assert_eq!(b.delay(0, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(3, 1.0), Duration::from_secs(8));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(60));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(60));
        assert_eq!(b.delay(3, 0.0), Duration::ZERO);
        assert_eq!(b.delay(3, 0.5), Duration::from_secs(4));
        assert_eq!(b.delay(3, f64::NAN), Duration::from_secs(8));
        assert_eq!(b.delay(3, -7.0), Duration::ZERO);
    }

    #[test]
    fn attempts_and_age_are_capped() {
        assert!(matches!(
            decide(&answered(500), true, 5, Duration::ZERO, &P, 1.0),
            Verdict::Dead(_)
        ));
        let old = Duration::from_secs(3599);
        assert!(matches!(
            decide(&answered(500), true, 2, old, &P, 1.0),
            Verdict::Dead(_)
        ));
    }

    #[test]
    fn state_names_round_trip() {
        for s in [
            DeliveryState::Pending,
            DeliveryState::InFlight,
            DeliveryState::Delivered,
            DeliveryState::Retrying,
            DeliveryState::Uncertain,
            DeliveryState::Dead,
        ] {
            assert_eq!(DeliveryState::parse(s.as_str()), Some(s));
        }
        for name in DeliveryState::NAMES {
            assert_eq!(
                DeliveryState::parse(name).map(DeliveryState::as_str),
                Some(name)
            );
        }
    }
}
