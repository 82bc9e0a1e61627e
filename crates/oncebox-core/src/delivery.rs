//! Delivery policy without IO: how one attempt's result is classified, and what the relay does
//! next — delivered, retry after a backoff with full jitter, parked as uncertain, or dead.

use std::fmt;
use std::time::Duration;

use crate::route::Route;

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
    /// The longest wait after `attempts_made` (counted from 0): the base doubled that many
    /// times, at most the cap.
    fn ceiling(&self, attempts_made: u32) -> Duration {
        self.base
            .saturating_mul(2u32.saturating_pow(attempts_made.min(31)))
            .min(self.cap)
    }

    /// The longest `waits` waits can take together (each its ceiling); with full jitter they
    /// take half of it on average.
    pub fn span(&self, waits: u32) -> Duration {
        let mut sum = Duration::ZERO;
        for n in 0..waits {
            let ceiling = self.ceiling(n);
            if ceiling == self.cap {
                // Every wait from here on is the cap: no loop over billions of them.
                return sum.saturating_add(self.cap.saturating_mul(waits - n));
            }
            sum = sum.saturating_add(ceiling);
        }
        sum
    }

    /// `jitter` in `[0, 1]` comes from the caller's random source, so this stays pure.
    pub fn delay(&self, attempts_made: u32, jitter: f64) -> Duration {
        let ceiling = self.ceiling(attempts_made);
        // A NaN from a broken random source must not panic `mul_f64`: wait the full ceiling.
        let jitter = if jitter.is_nan() {
            1.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        // `mul_f64` panics when the product rounds past `Duration::MAX`, which a ceiling within
        // a few thousand seconds of it does even at a jitter of 1 (a backoff of `Duration::MAX`,
        // or 2^34 s doubled 31 times): such a ceiling is waited whole.
        Duration::try_from_secs_f64(ceiling.as_secs_f64() * jitter)
            .map_or(ceiling, |d| d.min(ceiling))
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
        let (max_age, backoff) = (Duration::from_secs(3 * 24 * 3600), Backoff::default());
        RetryPolicy {
            max_attempts: RetryPolicy::attempts_for(max_age, backoff),
            max_age,
            backoff,
        }
    }
}

/// Most attempts [`RetryPolicy::attempts_for`] gives: a backoff whose waits are tiny against
/// the age would otherwise ask for millions.
pub const MOST_ATTEMPTS: u32 = 10_000;

impl RetryPolicy {
    /// Attempts enough for `max_age` to decide when a failing delivery dies, not the count:
    /// their waits' ceilings add up to three times `max_age`, at most [`MOST_ATTEMPTS`]. Full
    /// jitter waits half a ceiling on average, so the count would be reached at one and a half
    /// times the age on average, and the spread of a sum of so many waits is a few percent.
    /// A count of 15 with the default backoff (1 s doubling to 1 h) was spent within 3 hours
    /// at most and 1.6 on average: a receiver down for an afternoon lost most of its backlog,
    /// whatever `max_age` said. With the defaults this is 228 attempts, the last ones half an
    /// hour apart on average.
    pub fn attempts_for(max_age: Duration, backoff: Backoff) -> u32 {
        let wanted = max_age.saturating_mul(3);
        let mut span = Duration::ZERO;
        for waits in 0..MOST_ATTEMPTS {
            if span >= wanted {
                return waits + 1;
            }
            span = span.saturating_add(backoff.ceiling(waits));
        }
        MOST_ATTEMPTS
    }
}

/// What the relay records after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    Delivered,
    /// Try again after this wait.
    Retry(Duration),
    /// The outcome is unknown and retrying could apply it twice: wait for reconciliation, its
    /// status URL first asked after this wait.
    Uncertain(Duration),
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

/// `text` (an attempt's error, an operator's note) as every store keeps it: a NUL byte as
/// U+FFFD. Errors quote what the other side said (a broker's `reply_text`, a TLS library's
/// chain), and PostgreSQL's `text` refuses NUL: the record failed as a storage error, every
/// time, until the lease ran out and the delivery was taken over as possibly sent.
pub fn storable(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

impl Verdict {
    /// The delivery's new state and bookkeeping after an attempt whose error (if any) was
    /// `error`, at `now`; the same on every backend.
    pub fn recorded(&self, error: Option<&str>, now: crate::clock::Timestamp) -> Recorded {
        let error = error.map(storable);
        let (state, next_attempt_at, delivered_at, last_error) = match self {
            Verdict::Delivered => ("delivered", None, Some(now.millis()), error),
            Verdict::Retry(wait) => ("retrying", Some(now.plus(*wait).millis()), None, error),
            // Why it gave up, and the attempt's own error after it: either alone left an
            // operator unable to tell a cap reached from the receiver's refusal.
            Verdict::Dead(reason) => (
                "dead",
                None,
                None,
                Some(match error {
                    Some(e) => format!("{}: {e}", storable(reason)),
                    None => storable(reason),
                }),
            ),
            // `Uncertain`: parking it for reconciliation neither claims an outcome nor risks a
            // second effect. Its status URL is first asked a while later ([`decide`]).
            Verdict::Uncertain(wait) => ("uncertain", Some(now.plus(*wait).millis()), None, error),
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
/// 2xx is delivered. 301, 307, 308 (not followed), 408, 425, 429, 5xx and a request that never
/// left are retried (honouring `Retry-After`, never waiting less than the backoff asks), and so
/// is a 409 where the route honours the idempotency key (its earlier request still running).
/// Other 4xx are dead: the receiver refuses the request itself. A request sent without an
/// answer, answered by a proxy that forwarded it and got no answer (504, 520, 524), by another
/// redirect (which may follow the effect) or by a status of no class (a final 1xx, 600 and
/// past) is retried only when the route honours the idempotency key; otherwise it is
/// uncertain. Attempts and age are capped; a wait (backoff or `Retry-After`) past the age cap
/// waits until the cap for a last try. A last attempt of unknown outcome on a route with a
/// status URL is uncertain, not dead, even where the key is honoured: the receiver may have
/// applied it, and its status URL says which.
///
/// An uncertain delivery's status URL is first asked the route's timeout after the attempt,
/// within [`STATUS_RECHECK`] (10 s to 30 min): a receiver that timed out is often still at
/// work on the request, and asked too soon answers "not applied" and has it sent again.
/// Waiting a timeout more gives it twice the time it was given to answer.
///
/// [`STATUS_RECHECK`]: crate::relay_store::STATUS_RECHECK
pub fn decide(
    attempt: &Attempt,
    route: &Route,
    attempts_made: u32,
    age: Duration,
    jitter: f64,
) -> Verdict {
    let (idempotent, policy) = (route.idempotent, &route.retry);
    // Within the bounds every later question keeps: a route without a timeout of its own
    // (`Duration::MAX`) was never asked.
    let (least, most) = crate::relay_store::STATUS_RECHECK;
    let uncertain = Verdict::Uncertain(route.timeout.clamp(least, most));
    // Past here the attempt is retried (caps allowing); `unknown`: it may have been applied.
    let unknown = match attempt {
        Attempt::Answered { status, .. } if (200..300).contains(status) => {
            return Verdict::Delivered;
        }
        Attempt::Answered {
            status: 408 | 425 | 429,
            ..
        } => false,
        // A proxy's gateway timeout (504, Cloudflare's 524): it forwarded the request and its
        // upstream did not answer in time. Cloudflare's 520: the origin took the request and
        // answered nothing it could read (an empty reply, a reset: a worker that died mid-way).
        // The outcome is as unknown as after a timeout of the relay's own, and sending again
        // could apply it twice.
        Attempt::Answered {
            status: 504 | 520 | 524,
            ..
        } if !idempotent => return uncertain,
        Attempt::Answered {
            status: 504 | 520 | 524,
            ..
        } => true,
        Attempt::Answered { status, .. } if (500..600).contains(status) => false,
        // Redirects are not followed (the request would go where the route's owner did not
        // send it). 301, 307 and 308 say the request belongs elsewhere, unapplied: a receiver
        // that moved is a configuration to fix while retries last, not a refusal, and every
        // delivery to it would die at once. Any other 3xx (a 302 or 303 after a POST, as web
        // frameworks answer once they applied it) may follow the effect: it is sent again only
        // where the key is honoured.
        Attempt::Answered {
            status: 301 | 307 | 308,
            ..
        } => false,
        Attempt::Answered { status, .. } if (300..400).contains(status) && !idempotent => {
            return uncertain;
        }
        Attempt::Answered { status, .. } if (300..400).contains(status) => true,
        // A receiver that honours the key answers 409 while an earlier request with it is
        // still running (a timed-out attempt it is still at): ask again, as it says. Where
        // the key means nothing to the receiver, a 409 refuses the request itself.
        Attempt::Answered { status: 409, .. } if idempotent => true,
        Attempt::Answered { status, .. } if (400..500).contains(status) => {
            return Verdict::Dead(format!("receiver answered {status}"));
        }
        // A status no class gives a meaning (a final 1xx, 600 and past: a broken receiver or
        // proxy) came after the request was read, maybe applied: an answer that says nothing.
        Attempt::Answered { .. } | Attempt::NoAnswer(_) if idempotent => true,
        Attempt::Answered { .. } | Attempt::NoAnswer(_) => return uncertain,
        Attempt::NotSent(_) => false,
    };
    let spent = attempts_made >= policy.max_attempts || age >= policy.max_age;
    if spent && unknown && route.status_url.is_some() {
        return uncertain;
    }
    if attempts_made >= policy.max_attempts {
        return Verdict::Dead(format!("gave up after {attempts_made} attempts"));
    }
    if age >= policy.max_age {
        return Verdict::Dead(format!(
            "older than {:?} before the next attempt",
            policy.max_age
        ));
    }
    let backoff = policy
        .backoff
        .delay(attempts_made.saturating_sub(1), jitter);
    let wait = match attempt {
        Attempt::Answered {
            retry_after: Some(asked),
            ..
        } if *asked > backoff => *asked,
        _ => backoff,
    };
    // A wait past the age cap gets one last try at the cap rather than none: dead now would
    // drop an event a receiver only asked to hold, and with full jitter whether a backoff
    // crosses the cap is a throw of the dice, not the receiver's answer.
    Verdict::Retry(wait.min(policy.max_age - age))
}

#[cfg(test)]
mod tests;
