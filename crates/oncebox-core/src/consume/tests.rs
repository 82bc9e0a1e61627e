//! Unit tests of message mapping, the settle decision and the counts: keys come only from the
//! configured place, bad messages get a reason, only committed outcomes are acknowledged.

use std::borrow::Cow;
use std::time::Duration;

use super::*;
use crate::Event;
use crate::fingerprint::{Fingerprint, FingerprintMode};
use crate::json::Pointer;
use crate::key::Source;
use crate::outcome::{ProcessError, Processed, Response, Unavailable};

struct H(Vec<(&'static str, &'static [u8])>, Option<&'static [u8]>);

impl MessageHeaders for H {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| Cow::Borrowed(*v))
    }
    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        self.1.map(Cow::Borrowed)
    }
}

fn rules(key: KeyRule) -> MessageRules {
    MessageRules::new(Source::new("shop").unwrap(), key)
}

fn slug(r: Result<Event, Reason>) -> &'static str {
    r.map(|_| "ok").unwrap_or_else(|e| e.slug())
}

#[test]
fn keys_come_from_the_configured_place_only() {
    let body = br#"{"id":"evt_1","n":7}"#.to_vec();
    let h = H(vec![("x-id", b"hdr_1")], Some(b"mid_1"));
    let id = |r: &MessageRules| r.event(&h, body.clone(), None).unwrap().key.event_id;
    assert_eq!(id(&rules(KeyRule::Header("x-id".into()))).as_str(), "hdr_1");
    assert_eq!(id(&rules(KeyRule::MessageId)).as_str(), "mid_1");
    let ptr = KeyRule::Pointer(Pointer::parse("/id").unwrap());
    assert_eq!(id(&rules(ptr)).as_str(), "evt_1");
    let num = KeyRule::Pointer(Pointer::parse("/n").unwrap());
    assert_eq!(id(&rules(num)).as_str(), "7");
    // Past 64 bits too, as the gateway takes it.
    let big = br#"{"n":18446744073709551615}"#.to_vec();
    let num = rules(KeyRule::Pointer(Pointer::parse("/n").unwrap()));
    let key = num.event(&h, big, None).unwrap().key;
    assert_eq!(key.event_id.as_str(), "18446744073709551615");
    let derived = KeyRule::Derive(vec![Pointer::parse("/n").unwrap()]);
    assert_eq!(id(&rules(derived.clone())).as_str().len(), 64);
    // Beside a derived key the fingerprint is the key's fields: the same fact in a new
    // envelope is the same event, not the key reused with another payload.
    let derived = rules(derived);
    let at = |sent: &str| {
        let body = format!(r#"{{"n":7,"sent":"{sent}"}}"#).into_bytes();
        derived.event(&h, body, None).unwrap().fingerprint
    };
    assert_eq!(at("10:00"), at("10:05"));
}

#[test]
fn bad_messages_get_a_reason_never_a_panic() {
    let none = H(vec![("x-id", b"\xff\xfe")], None);
    let header = rules(KeyRule::Header("x-id".into()));
    let ptr = rules(KeyRule::Pointer(Pointer::parse("/id").unwrap()));
    let ok = br#"{"id":"a"}"#.to_vec();
    assert_eq!(
        slug(header.event(&none, ok.clone(), None)),
        "event-id-invalid"
    );
    let other = rules(KeyRule::Header("absent".into()));
    assert_eq!(
        slug(other.event(&none, ok.clone(), None)),
        "event-id-missing"
    );
    let mid = rules(KeyRule::MessageId);
    assert_eq!(slug(mid.event(&none, ok, None)), "event-id-missing");
    for (body, want) in [
        (&b"not json"[..], "invalid-json"),
        (b"", "invalid-json"),
        (br#"{"id":{}}"#, "event-id-invalid"),
        (br#"{"id":1.5}"#, "event-id-invalid"),
        (br#"{"id":"   "}"#, "event-id-invalid"),
        (br#"{"id":"a "}"#, "event-id-invalid"),
        (br#"{"other":1}"#, "event-id-missing"),
        (br#"{"id":"a","id":"b"}"#, "invalid-json"),
    ] {
        assert_eq!(
            slug(ptr.event(&none, body.to_vec(), None)),
            want,
            "{body:?}"
        );
    }
    let derived = rules(KeyRule::Derive(vec![Pointer::parse("/id").unwrap()]));
    for (body, want) in [
        (&b"not json"[..], "invalid-json"),
        (br#"{"other":1}"#, "event-id-missing"),
    ] {
        let got = slug(derived.event(&none, body.to_vec(), None));
        assert_eq!(got, want, "derived from {body:?}");
    }
    let mut small = ptr.clone();
    small.max_body = 4;
    assert_eq!(
        slug(small.event(&none, b"{}    ".to_vec(), None)),
        "body-too-large"
    );
    let deep = "[".repeat(100_000);
    assert_eq!(
        slug(ptr.event(&none, deep.into_bytes(), None)),
        "invalid-json"
    );
    // A header key with a non-JSON body is fine under the raw fingerprint only.
    let raw = MessageRules {
        fingerprint: FingerprintMode::Raw,
        ..rules(KeyRule::Header("x-id".into()))
    };
    let h = H(vec![("x-id", b"k")], None);
    assert_eq!(slug(raw.event(&h, b"\x00\x01".to_vec(), None)), "ok");
}

#[test]
fn only_committed_outcomes_are_acknowledged() {
    let p = RetryPolicy::default();
    let done = Processed::Applied(Response::completed(""));
    assert_eq!(decide(Ok(done.clone()), 1, &p), Settle::Ack(done));
    let dup = Processed::Duplicate(Response::completed(""));
    assert_eq!(decide(Ok(dup.clone()), 9, &p), Settle::Ack(dup));
    for attempt in [1, 5, 1000] {
        let busy = Err(ProcessError::Unavailable(Unavailable::Busy));
        assert_eq!(
            decide(busy, attempt, &p),
            Settle::Requeue {
                why: Requeue::Unavailable,
                after: p.delay
            },
            "unavailable is never quarantined nor acked"
        );
    }
    let uncertain = decide(Err(ProcessError::Uncertain), 1, &p);
    assert!(matches!(
        uncertain,
        Settle::Requeue {
            why: Requeue::Uncertain,
            ..
        }
    ));
    let fp = Fingerprint::from([0; 32]);
    let conflict = Err(ProcessError::Conflict {
        stored: fp,
        offered: fp,
    });
    assert!(matches!(
        decide(conflict, 1, &p),
        Settle::Quarantine(Reason::KeyReused { .. })
    ));
    let failed = || Err(ProcessError::Handler("boom".into()));
    assert!(matches!(decide(failed(), 1, &p), Settle::Requeue { .. }));
    let last = decide(failed(), p.max_attempts, &p);
    assert!(matches!(last, Settle::Quarantine(ref r) if r.slug() == "handler-failed"));
}

#[test]
fn counts_tell_acks_from_requeues() {
    let mut c = Counts::default();
    c.add(
        &Settle::Ack(Processed::Applied(Response::completed(""))),
        true,
    );
    c.add(
        &Settle::Ack(Processed::Duplicate(Response::completed(""))),
        false,
    );
    c.add(
        &Settle::Quarantine(Reason::InvalidJson(String::new())),
        true,
    );
    c.add(
        &Settle::Requeue {
            why: Requeue::Unavailable,
            after: Duration::ZERO,
        },
        false,
    );
    assert_eq!(
        (c.applied, c.duplicates, c.quarantined, c.requeued),
        (1, 1, 1, 1)
    );
    assert_eq!((c.acked, c.ack_failures), (2, 1));
}

#[test]
fn a_content_type_no_request_could_carry_is_dropped_and_the_event_kept() {
    let h = H(vec![("x-id", b"e1")], None);
    let rules = rules(KeyRule::Header("x-id".into()));
    let body = br#"{"n":1}"#.to_vec();
    let stored = |ct: &str| {
        let e = rules
            .event(&h, body.clone(), Some(ct))
            .expect("the event is kept");
        e.meta.content_type
    };
    assert_eq!(
        stored("text/plain; charset=utf-8").as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(stored("text/plain\u{1}"), None);
    assert_eq!(stored("caf\u{e9}"), None);
    assert_eq!(stored(&"a".repeat(256)), None);
    assert_eq!(stored(&"a".repeat(255)).map(|c| c.len()), Some(255));
}

#[test]
fn a_long_detail_is_cut_on_a_character_boundary_and_says_so() {
    // Two-byte characters, so a cut at an odd byte would split one.
    let error = "é".repeat(100_000);
    let failed = Reason::HandlerFailed {
        attempts: 1,
        error: error.clone(),
    };
    let detail = failed.detail();
    assert!(detail.len() <= MAX_DETAIL, "{} bytes", detail.len());
    assert!(detail.starts_with("handler failed on 1 deliveries: éé"));
    assert!(detail.ends_with(" [cut: 200032 bytes in all]"), "{detail}");
    let invalid = Reason::Invalid(error).detail();
    assert!(invalid.len() <= MAX_DETAIL && invalid.contains("[cut: "));
    // Short ones stay whole; a room too small for the mark keeps what fits.
    assert_eq!(Reason::Invalid("bad".into()).detail(), "bad");
    assert_eq!(failed.detail_within(5), "handl");
    assert_eq!(Reason::Invalid("é".repeat(3)).detail_within(3), "é");
}

/// Headers whose `x-id` is present as a type the transport cannot read as text.
struct Typed;

impl MessageHeaders for Typed {
    fn header(&self, _: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        None
    }
    fn unreadable(&self, name: &str) -> Option<&'static str> {
        (name == "x-id").then_some("double")
    }
}

#[test]
fn a_key_header_of_another_type_is_invalid_not_missing() {
    let body = br#"{"n":1}"#.to_vec();
    let typed = rules(KeyRule::Header("x-id".into())).event(&Typed, body.clone(), None);
    assert_eq!(
        typed.unwrap_err(),
        Reason::EventIdInvalid("header x-id is a double, not text or an integer".into())
    );
    let absent = rules(KeyRule::Header("other".into())).event(&Typed, body, None);
    assert_eq!(absent.unwrap_err().slug(), "event-id-missing");
}

#[test]
fn a_retry_policy_without_a_pause_is_refused() {
    assert_eq!(RetryPolicy::default().check(), Ok(()));
    let at_least = RetryPolicy {
        delay: MIN_RETRY_DELAY,
        uncertain_delay: MIN_RETRY_DELAY,
        max_attempts: 1,
    };
    assert_eq!(at_least.check(), Ok(()));
    let no_delay = RetryPolicy {
        delay: Duration::ZERO,
        ..RetryPolicy::default()
    };
    assert_eq!(
        no_delay.check(),
        Err(RetryPolicyError::TooShort {
            field: "delay",
            found: Duration::ZERO
        })
    );
    let err = no_delay.check().unwrap_err().to_string();
    assert!(err.contains("retry delay is 0ns, less than 10ms"), "{err}");
    let no_uncertain_delay = RetryPolicy {
        uncertain_delay: Duration::from_millis(9),
        ..RetryPolicy::default()
    };
    assert!(matches!(
        no_uncertain_delay.check(),
        Err(RetryPolicyError::TooShort {
            field: "uncertain_delay",
            ..
        })
    ));
}

/// A failed handler is worth a warning each time, with its attempt and error; an outage once
/// a minute in the process, however many messages it holds; a settled outcome never.
#[test]
fn failures_are_worth_a_warning_and_an_outage_once_a_minute() {
    let failed: Result<Processed, ProcessError> = Err(ProcessError::Handler("no stock".into()));
    let line = worth_a_warning(&failed, 2).unwrap();
    assert!(
        line.contains("attempt 2") && line.contains("no stock"),
        "{line}"
    );
    assert!(worth_a_warning(&failed, 3).is_some());
    let down: Result<Processed, ProcessError> = Err(Unavailable::Busy.into());
    let line = worth_a_warning(&down, 1).unwrap();
    assert!(line.contains("store unavailable"), "{line}");
    assert_eq!(worth_a_warning(&down, 1), None, "said once a minute");
    let done = Ok(Processed::Applied(Response::completed("ok")));
    assert_eq!(worth_a_warning(&done, 1), None);
}

/// The loop guard: a message's hop count, in either spelling, rides on its event, and one at
/// the limit is refused before its key is read, whatever the key rule.
#[test]
fn a_message_that_went_round_too_often_is_refused() {
    let body = br#"{"id":"evt_1"}"#.to_vec();
    let r = rules(KeyRule::MessageId);
    let hops = |h: &H| r.event(h, body.clone(), None).map(|e| e.meta.hops());
    assert_eq!(hops(&H(vec![], Some(b"m"))), Ok(0));
    assert_eq!(hops(&H(vec![("oncebox-hops", b"3")], Some(b"m"))), Ok(3));
    assert_eq!(hops(&H(vec![("Oncebox-Hops", b"15")], Some(b"m"))), Ok(15));
    let at_limit = r.event(&H(vec![("oncebox-hops", b"16")], None), body.clone(), None);
    assert_eq!(slug(at_limit.clone()), "hop-limit", "before the missing id");
    assert!(at_limit.unwrap_err().detail().contains("16"));
    let garbled = r.event(&H(vec![("Oncebox-Hops", b"x")], Some(b"m")), body, None);
    assert_eq!(slug(garbled), "hops-invalid");
}

/// Headers as NATS carries them: a name may come several times.
struct Many(Vec<(&'static str, &'static [u8])>);

impl MessageHeaders for Many {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.header_values(name).into_iter().next()
    }
    fn header_values(&self, name: &str) -> Vec<Cow<'_, [u8]>> {
        let named = self.0.iter().filter(|(n, _)| *n == name);
        named.map(|(_, v)| Cow::Borrowed(*v)).collect()
    }
    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(b"m"))
    }
}

/// A sender in the loop cannot lower the count: of every value of either spelling the highest
/// counts, and a value of a type that is no count (an AMQP float) is refused, not read as none.
#[test]
fn a_hop_count_cannot_be_lowered_by_another_header() {
    let body = br#"{"id":"evt_1"}"#.to_vec();
    let r = rules(KeyRule::MessageId);
    let read = |h: &Many| r.event(h, body.clone(), None).map(|e| e.meta.hops());
    assert_eq!(
        read(&Many(vec![("Oncebox-Hops", b"0"), ("Oncebox-Hops", b"7")])),
        Ok(7)
    );
    assert_eq!(
        read(&Many(vec![("oncebox-hops", b"1"), ("Oncebox-Hops", b"9")])),
        Ok(9)
    );
    let over = Many(vec![("Oncebox-Hops", b"0"), ("Oncebox-Hops", b"20")]);
    assert_eq!(slug(r.event(&over, body.clone(), None)), "hop-limit");
    let float = r.event(&FloatHops, body, None);
    assert_eq!(slug(float), "hops-invalid");
}

/// A key header sent twice names no one event: refused as the gateway refuses it, not read as
/// its first value.
#[test]
fn a_key_header_sent_twice_is_invalid() {
    let body = br#"{"id":"evt_1"}"#.to_vec();
    let r = rules(KeyRule::Header("Event-Id".into()));
    let twice = Many(vec![("Event-Id", b"a"), ("Event-Id", b"b")]);
    let refused = r.event(&twice, body.clone(), None).unwrap_err();
    assert_eq!(refused.slug(), "event-id-invalid");
    assert!(
        refused.detail().contains("more than once"),
        "{}",
        refused.detail()
    );
    let once = Many(vec![("Event-Id", b"a"), ("Other", b"b")]);
    let event = r.event(&once, body, None).unwrap();
    assert_eq!(event.key.event_id.as_str(), "a");
}

/// An AMQP message whose `oncebox-hops` is a double.
struct FloatHops;

impl MessageHeaders for FloatHops {
    fn header(&self, _: &str) -> Option<Cow<'_, [u8]>> {
        None
    }
    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(b"m"))
    }
    fn unreadable(&self, name: &str) -> Option<&'static str> {
        (name == "oncebox-hops").then_some("double")
    }
}
