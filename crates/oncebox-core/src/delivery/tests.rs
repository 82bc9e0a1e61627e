//! The delivery decision's cases: what each answer makes of a delivery, backoff, the caps.

use super::*;
use crate::relay_store::STATUS_RECHECK;

const P: RetryPolicy = RetryPolicy {
    max_attempts: 5,
    max_age: Duration::from_secs(3600),
    backoff: Backoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(60),
    },
};

/// The decision for a route with policy `p` that honours the key or not: no status URL, the
/// default timeout.
fn decide(
    attempt: &Attempt,
    idempotent: bool,
    attempts_made: u32,
    age: Duration,
    p: &RetryPolicy,
    jitter: f64,
) -> Verdict {
    let mut route = Route::new("r", "https://r.example/hook");
    route.idempotent = idempotent;
    route.retry = *p;
    super::decide(attempt, &route, attempts_made, age, jitter)
}

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
        Verdict::Uncertain(STATUS_RECHECK.0)
    );
    // A proxy that forwarded the request and timed out waiting says no more.
    for status in [504, 520, 524] {
        let timed_out = answered(status);
        let retried = decide(&timed_out, true, 1, Duration::ZERO, &P, 1.0);
        assert!(matches!(retried, Verdict::Retry(_)), "{status}");
        let parked = decide(&timed_out, false, 1, Duration::ZERO, &P, 1.0);
        assert_eq!(parked, Verdict::Uncertain(STATUS_RECHECK.0), "{status}");
    }
    let refused = decide(&answered(502), false, 1, Duration::ZERO, &P, 1.0);
    assert!(matches!(refused, Verdict::Retry(_)));
    // A redirect after a POST is what a web framework answers once it applied the request.
    for status in [300, 302, 303, 304, 305, 306, 399] {
        let retried = decide(&answered(status), true, 1, Duration::ZERO, &P, 1.0);
        assert!(matches!(retried, Verdict::Retry(_)), "{status}");
        let parked = decide(&answered(status), false, 1, Duration::ZERO, &P, 1.0);
        assert_eq!(parked, Verdict::Uncertain(STATUS_RECHECK.0), "{status}");
    }
}

#[test]
fn in_progress_is_asked_again_only_where_the_key_is_honoured() {
    let busy = Attempt::Answered {
        status: 409,
        retry_after: Some(Duration::from_secs(20)),
    };
    assert_eq!(
        decide(&busy, true, 1, Duration::ZERO, &P, 0.0),
        Verdict::Retry(Duration::from_secs(20))
    );
    assert!(matches!(
        decide(&busy, false, 1, Duration::ZERO, &P, 0.0),
        Verdict::Dead(_)
    ));
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

/// A pause asked past the age cap (a 429 with `Retry-After` of days) waits until the cap for
/// one last try; dead at once would drop an event the receiver only asked to hold.
#[test]
fn retry_after_past_the_age_cap_waits_until_the_cap_for_a_last_try() {
    let a = Attempt::Answered {
        status: 429,
        retry_after: Some(Duration::from_secs(999_999_999)),
    };
    let age = Duration::from_secs(600);
    assert_eq!(
        decide(&a, false, 1, age, &P, 1.0),
        Verdict::Retry(P.max_age - age)
    );
    // The cap reached: dead, as any retry past it.
    assert!(matches!(
        decide(&a, false, 2, P.max_age, &P, 1.0),
        Verdict::Dead(_)
    ));
}

/// A status no class gives a meaning came after the request was read: as no answer.
#[test]
fn a_status_of_no_class_is_as_no_answer() {
    for status in [100, 101, 103, 199, 600, 999, 0, u16::MAX] {
        let retried = decide(&answered(status), true, 1, Duration::ZERO, &P, 1.0);
        assert!(matches!(retried, Verdict::Retry(_)), "{status}");
        let parked = decide(&answered(status), false, 1, Duration::ZERO, &P, 1.0);
        assert_eq!(parked, Verdict::Uncertain(STATUS_RECHECK.0), "{status}");
    }
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
fn a_backoff_near_the_longest_duration_waits_its_ceiling_without_panicking() {
    let max = Backoff {
        base: Duration::MAX,
        cap: Duration::MAX,
    };
    assert_eq!(max.delay(0, 1.0), Duration::MAX);
    assert!(max.delay(0, 0.5) < Duration::MAX);
    let doubled = Backoff {
        base: Duration::from_secs(1 << 34),
        cap: Duration::MAX,
    };
    assert_eq!(doubled.delay(31, 1.0), Duration::MAX);
    assert_eq!(doubled.delay(31, 0.0), Duration::ZERO);
}

#[test]
fn attempts_and_age_are_capped() {
    assert!(matches!(
        decide(&answered(500), true, 5, Duration::ZERO, &P, 1.0),
        Verdict::Dead(_)
    ));
    // A backoff past the age cap waits until the cap for a last try; at the cap, dead.
    let old = Duration::from_secs(3599);
    assert_eq!(
        decide(&answered(500), true, 2, old, &P, 1.0),
        Verdict::Retry(Duration::from_secs(1))
    );
    assert!(matches!(
        decide(&answered(500), true, 2, P.max_age, &P, 0.0),
        Verdict::Dead(_)
    ));
}

/// Full jitter draws a backoff anywhere up to its ceiling; whether a delivery near the age cap
/// gets its last try must not depend on the draw.
#[test]
fn the_verdict_near_the_age_cap_does_not_depend_on_the_jitter() {
    let age = P.max_age - Duration::from_secs(2);
    let asked = Attempt::Answered {
        status: 429,
        retry_after: Some(Duration::from_secs(999_999)),
    };
    for jitter in [0.0, 0.5, 1.0] {
        assert_eq!(
            decide(&asked, false, 3, age, &P, jitter),
            Verdict::Retry(Duration::from_secs(2)),
            "jitter {jitter}"
        );
        // Without a pause asked: the backoff's draw, but never past the cap.
        let Verdict::Retry(wait) = decide(&answered(503), false, 3, age, &P, jitter) else {
            panic!("not retried at jitter {jitter}");
        };
        assert!(
            wait <= Duration::from_secs(2),
            "{wait:?} at jitter {jitter}"
        );
    }
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

/// A route that does not honour the key, with a status URL and `timeout`.
fn asked_route(idempotent: bool, timeout: Duration) -> Route {
    let mut route = Route::new("r", "https://r.example/hook");
    route.idempotent = idempotent;
    route.status_url = Some("https://r.example/status/{key}".into());
    route.timeout = timeout;
    route.retry = P;
    route
}

/// The status URL is first asked no sooner than the route's timeout after the attempt: a
/// receiver given a minute to answer may still be at work 10 s after the relay gave up.
#[test]
fn an_uncertain_deliverys_first_check_waits_at_least_the_routes_timeout() {
    let lost = Attempt::NoAnswer("timeout".into());
    let slow = asked_route(false, Duration::from_secs(60));
    assert_eq!(
        super::decide(&lost, &slow, 1, Duration::ZERO, 1.0),
        Verdict::Uncertain(Duration::from_secs(60))
    );
    let quick = asked_route(false, Duration::from_secs(2));
    assert_eq!(
        super::decide(&lost, &quick, 1, Duration::ZERO, 1.0),
        Verdict::Uncertain(STATUS_RECHECK.0)
    );
    // A route with no timeout of its own is still asked, within the longest wait.
    let endless = asked_route(false, Duration::MAX);
    assert_eq!(
        super::decide(&lost, &endless, 1, Duration::ZERO, 1.0),
        Verdict::Uncertain(STATUS_RECHECK.1)
    );
    let at = crate::clock::Timestamp(1_000);
    let recorded = Verdict::Uncertain(Duration::from_secs(60)).recorded(Some("timeout"), at);
    assert_eq!(
        (recorded.state, recorded.next_attempt_at),
        ("uncertain", Some(61_000))
    );
}

/// Where the key is honoured, a last attempt that may have been applied is asked about, not
/// given up on: dead, it read as never applied, and its status URL could say it was. An
/// answer that says it was not applied, or a route with nothing to ask, is dead as before.
#[test]
fn a_last_attempt_of_unknown_outcome_is_asked_about_where_a_status_url_is() {
    let asked = asked_route(true, Duration::from_secs(10));
    let busy = Attempt::Answered {
        status: 409,
        retry_after: None,
    };
    let unknown = [
        Attempt::NoAnswer("timeout".into()),
        answered(504),
        answered(520),
        answered(524),
        answered(302),
        answered(600),
        busy,
    ];
    for attempt in &unknown {
        for (made, age) in [(P.max_attempts, Duration::ZERO), (1, P.max_age)] {
            assert_eq!(
                super::decide(attempt, &asked, made, age, 1.0),
                Verdict::Uncertain(STATUS_RECHECK.0),
                "{attempt:?} after {made} attempts at {age:?}"
            );
            assert!(matches!(
                decide(attempt, true, made, age, &P, 1.0),
                Verdict::Dead(_)
            ));
        }
        // Before the caps it is retried, the key honoured.
        assert!(matches!(
            super::decide(attempt, &asked, 1, Duration::ZERO, 1.0),
            Verdict::Retry(_)
        ));
    }
    for known in [
        answered(500),
        answered(503),
        answered(429),
        answered(308),
        Attempt::NotSent("connection refused".into()),
    ] {
        assert!(
            matches!(
                super::decide(&known, &asked, P.max_attempts, Duration::ZERO, 1.0),
                Verdict::Dead(_)
            ),
            "{known:?}"
        );
    }
}

/// With the default policy a receiver that answers 503 for ever is tried until the age cap,
/// not until a count spent within hours: at the mean jitter, at a constant 0.34, and in a
/// hundred runs of random jitters (a fixed sequence), the delivery dies of its age, after
/// three days.
#[test]
fn the_default_policy_retries_until_its_age_not_its_count() {
    let p = RetryPolicy::default();
    assert_eq!(p.max_age, Duration::from_secs(3 * 24 * 3600));
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut random = move || {
        // xorshift64: a fixed sequence of jitters in [0, 1).
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let runs: Vec<Option<f64>> = [Some(0.5), Some(0.34)]
        .into_iter()
        .chain(std::iter::repeat_n(None, 100))
        .collect();
    for fixed in runs {
        let (mut made, mut age) = (1, Duration::ZERO);
        let why = loop {
            let jitter = fixed.unwrap_or_else(&mut random);
            match decide(&answered(503), false, made, age, &p, jitter) {
                Verdict::Retry(wait) => (made, age) = (made + 1, age + wait),
                Verdict::Dead(why) => break why,
                other => panic!("{other:?}"),
            }
        };
        assert!(why.starts_with("older than"), "{fixed:?}: {why} at {age:?}");
        assert!(age >= p.max_age, "{age:?}");
    }
    assert_eq!(p.max_attempts, 228);
    // Spans and counts for other policies: tiny waits stop at the bound.
    let b = Backoff::default();
    assert_eq!(b.span(0), Duration::ZERO);
    assert_eq!(b.span(13), Duration::from_secs(4095 + 3600));
    let tiny = Backoff {
        base: Duration::from_millis(1),
        cap: Duration::from_millis(1),
    };
    assert_eq!(RetryPolicy::attempts_for(p.max_age, tiny), MOST_ATTEMPTS);
    let huge = Backoff {
        base: Duration::MAX,
        cap: Duration::MAX,
    };
    assert_eq!(RetryPolicy::attempts_for(p.max_age, huge), 2);
    assert_eq!(huge.span(40), Duration::MAX);
    // A count of billions is summed at once.
    assert_eq!(
        b.span(u32::MAX),
        Duration::from_secs(4095 + 3600 * (u64::from(u32::MAX) - 12))
    );
}
