//! One `[consumers.<name>]` table validated into a `ConsumerSpec`: a RabbitMQ queue or a NATS
//! JetStream stream read into the inbox, with where each message's key comes from, the
//! quarantine, and the in-flight limit.

pub(super) mod describe;

use std::time::Duration;

use oncebox_core::Source;
use oncebox_core::consume::{KeyRule, MessageRules, RetryPolicy};
use serde::Deserialize;

use super::Problems;
use super::raw::{ByteSize, HumanDuration, RawEventId, RawFingerprint};
use super::source::{pointer_into, pointers};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsumer {
    pub source: Option<String>,
    /// RabbitMQ: the queue to consume.
    pub queue: Option<String>,
    /// NATS: the JetStream stream, an optional filter subject and the durable's name.
    pub stream: Option<String>,
    pub subject: Option<String>,
    pub durable: Option<String>,
    pub key: Option<RawKey>,
    pub fingerprint: Option<RawFingerprint>,
    pub max_body: Option<ByteSize>,
    /// RabbitMQ: an exchange (routing key: the queue's name). NATS: a subject a stream keeps.
    pub quarantine: Option<String>,
    pub prefetch: Option<u32>,
    pub ack_wait: Option<HumanDuration>,
    pub retry_delay: Option<HumanDuration>,
    pub max_attempts: Option<u32>,
}

/// `"message-id"` or `{ header = … }` / `{ pointer = … }` / `{ derive = […] }`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawKey {
    Named(String),
    Table(RawEventId),
}

/// Which broker a consumer reads and what it names there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broker {
    Amqp {
        queue: String,
        /// Quarantine exchange.
        quarantine: String,
        prefetch: u16,
    },
    Nats {
        stream: String,
        subject: Option<String>,
        durable: String,
        /// Quarantine subject.
        quarantine: String,
        batch: usize,
        ack_wait: Duration,
    },
}

/// A validated consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    pub name: String,
    pub broker: Broker,
    pub rules: MessageRules,
    pub retry: RetryPolicy,
}

const DEFAULT_PREFETCH: u32 = 64;
const DEFAULT_MAX_BODY: u64 = 1 << 20;
const MAX_MAX_BODY: u64 = 64 << 20;
/// The library's floor, said here by field.
const MIN_RETRY_DELAY: Duration = oncebox_core::consume::MIN_RETRY_DELAY;
/// The longest retry delay on RabbitMQ: the longest a delivery is held.
const MAX_AMQP_RETRY_DELAY: Duration = oncebox_amqp::MAX_HOLD;

/// The consumer, or `None` after pushing its problems.
pub(super) fn validate(
    name: &str,
    raw: &RawConsumer,
    p: &mut Problems<'_>,
) -> Option<ConsumerSpec> {
    let path = format!("consumers.{name}");
    let before = p.count();
    let source = match raw.source.as_deref().map(Source::new) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            p.push(&format!("{path}.source"), e);
            None
        }
        None => {
            p.push(
                &format!("{path}.source"),
                "required: the source its keys belong to",
            );
            None
        }
    };
    let key = match &raw.key {
        None => {
            p.push(
                &format!("{path}.key"),
                "required: \"message-id\", { header = … }, { pointer = … } or { derive = […] }",
            );
            None
        }
        Some(k) => key(&format!("{path}.key"), k, p),
    };
    let derived = match &key {
        Some(KeyRule::Derive(fields)) => Some(fields.as_slice()),
        _ => None,
    };
    let fingerprint = super::source::fingerprint(&path, raw.fingerprint.as_ref(), derived, p);
    let max_body = raw.max_body.map_or(DEFAULT_MAX_BODY, |b| b.0);
    if max_body == 0 || max_body > MAX_MAX_BODY {
        p.push(
            &format!("{path}.max_body"),
            format_args!("must be 1 byte to {MAX_MAX_BODY} bytes"),
        );
    }
    let quarantine = raw.quarantine.clone().unwrap_or_default();
    if quarantine.trim().is_empty() {
        p.push(
            &format!("{path}.quarantine"),
            "required: where messages that can never be processed go (an exchange for RabbitMQ, a subject for NATS)",
        );
    }
    let prefetch = raw.prefetch.unwrap_or(DEFAULT_PREFETCH);
    if prefetch == 0 || prefetch > u32::from(u16::MAX) {
        p.push(&format!("{path}.prefetch"), "must be 1 to 65535");
    }
    let d = RetryPolicy::default();
    let retry = RetryPolicy {
        delay: raw.retry_delay.map_or(d.delay, |v| v.0),
        max_attempts: raw.max_attempts.unwrap_or(d.max_attempts),
        ..d
    };
    if retry.max_attempts == 0 {
        p.push(&format!("{path}.max_attempts"), "must be at least 1");
    }
    // No delay would turn a store outage into a tight loop of redeliveries.
    if retry.delay < MIN_RETRY_DELAY {
        p.push(&format!("{path}.retry_delay"), "must be at least 10ms");
    }
    // RabbitMQ holds a message in hand for the retry delay before it is requeued, and closes a
    // channel that holds one past its consumer_timeout (30 minutes by default): every message
    // in hand, those already committed too, would then come again, and again.
    if raw.queue.is_some() && retry.delay > MAX_AMQP_RETRY_DELAY {
        p.push(
            &format!("{path}.retry_delay"),
            "must be at most 5m on RabbitMQ (a message is held that long, and the broker's \
             consumer_timeout closes a channel that holds one too long)",
        );
    }
    for (field, value) in [
        ("queue", &raw.queue),
        ("stream", &raw.stream),
        ("subject", &raw.subject),
        ("durable", &raw.durable),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            p.push(&format!("{path}.{field}"), "must not be empty");
        }
    }
    let broker = match (&raw.queue, &raw.stream) {
        (Some(queue), None) => {
            // Both go to RabbitMQ as AMQP short strings (the quarantine's routing key is the
            // queue's name).
            for (field, value) in [("queue", queue), ("quarantine", &quarantine)] {
                if value.len() > oncebox_amqp::SHORT_STRING_MAX {
                    p.push(
                        &format!("{path}.{field}"),
                        format_args!(
                            "must be at most {} bytes on RabbitMQ",
                            oncebox_amqp::SHORT_STRING_MAX
                        ),
                    );
                }
            }
            for field in [("subject", &raw.subject), ("durable", &raw.durable)] {
                if field.1.is_some() {
                    p.push(
                        &format!("{path}.{}", field.0),
                        "only for NATS consumers (with stream)",
                    );
                }
            }
            if raw.ack_wait.is_some() {
                p.push(
                    &format!("{path}.ack_wait"),
                    "only for NATS consumers (with stream)",
                );
            }
            Some(Broker::Amqp {
                queue: queue.clone(),
                quarantine,
                prefetch: u16::try_from(prefetch).unwrap_or(u16::MAX),
            })
        }
        (None, Some(stream)) => {
            let ack_wait = raw.ack_wait.map_or(Duration::from_secs(30), |v| v.0);
            if ack_wait < Duration::from_secs(1) {
                p.push(&format!("{path}.ack_wait"), "must be at least 1s");
            }
            // The client refuses such a name before asking the server, at every connection:
            // `consume` would reconnect for ever, saying only "invalid name".
            refuse_jetstream_name(&format!("{path}.stream"), stream, p);
            if let Some(subject) = raw.subject.as_deref().filter(|s| !s.trim().is_empty()) {
                refuse_nats_filter(&format!("{path}.subject"), subject, p);
            }
            let durable = match &raw.durable {
                Some(durable) => {
                    refuse_jetstream_name(&format!("{path}.durable"), durable, p);
                    durable.clone()
                }
                None => {
                    let derived = default_durable(name);
                    if !jetstream_name(&derived) {
                        p.push(
                            &path,
                            format_args!(
                                "the consumer's name makes the default durable {derived:?}, \
                                 which is no JetStream name ({JETSTREAM_NAME_RULE}): set \
                                 durable to a name without them"
                            ),
                        );
                    }
                    derived
                }
            };
            Some(Broker::Nats {
                stream: stream.clone(),
                subject: raw.subject.clone(),
                durable,
                quarantine,
                batch: prefetch as usize,
                ack_wait,
            })
        }
        _ => {
            p.push(
                &path,
                "set exactly one of queue (RabbitMQ) or stream (NATS)",
            );
            None
        }
    };
    if p.count() > before {
        return None;
    }
    let mut rules = MessageRules::new(source?, key?);
    rules.fingerprint = fingerprint;
    rules.max_body = usize::try_from(max_body).unwrap_or(usize::MAX);
    Some(ConsumerSpec {
        name: name.to_owned(),
        broker: broker?,
        rules,
        retry,
    })
}

/// Refuses two consumers reading one queue, or one stream through one durable: the broker
/// hands each message, and each redelivery of it, to either, so one whose ack was lost could
/// be stored again by the other under its own source, key or fingerprint, as a second event.
/// Told at the later consumer, naming the earlier.
pub(super) fn refuse_shared_queues(consumers: &[ConsumerSpec], p: &mut Problems<'_>) {
    let read = |c: &ConsumerSpec| match &c.broker {
        Broker::Amqp { queue, .. } => ("queue", format!("queue {queue:?}")),
        Broker::Nats {
            stream, durable, ..
        } => (
            "durable",
            format!("stream {stream:?} through durable {durable:?}"),
        ),
    };
    for (i, c) in consumers.iter().enumerate() {
        let (field, what) = read(c);
        if let Some(earlier) = consumers[..i].iter().find(|e| read(e).1 == what) {
            p.push(
                &format!("consumers.{}.{field}", c.name),
                format_args!(
                    "consumers.{} reads {what} too: the broker would hand each message, and \
                     each redelivery of it, to either, and one stored by both would be two \
                     events; let one consumer read it",
                    earlier.name
                ),
            );
        }
    }
}

/// The durable a NATS consumer without `durable` reads through. Do not change: a consumer
/// would start a new durable and read its stream again from the retention horizon.
fn default_durable(consumer: &str) -> String {
    format!("oncebox-{consumer}")
}

/// Refuses a stream or durable name at `at` that JetStream would not take (a blank one is
/// refused as missing elsewhere).
fn refuse_jetstream_name(at: &str, name: &str, p: &mut Problems<'_>) {
    if !name.trim().is_empty() && !jetstream_name(name) {
        p.push(
            at,
            format_args!("{name:?} is no JetStream name: {JETSTREAM_NAME_RULE}"),
        );
    }
}

/// Refuses a consumer's subject filter the server would refuse when the durable is made: the
/// consumer would otherwise be set up again every 30 s for ever, warning only that it stopped.
fn refuse_nats_filter(at: &str, subject: &str, p: &mut Problems<'_>) {
    let tokens: Vec<&str> = subject.split('.').collect();
    // The server's own rule: these five characters, empty tokens, and `>` before the end.
    let why = if subject.contains([' ', '\t', '\n', '\r', '\x0c']) {
        Some("must not contain spaces, tabs or line breaks")
    } else if tokens.iter().any(|t| t.is_empty()) {
        Some("must not begin or end with '.' or hold '..' (every token needs a name)")
    } else if tokens.iter().rev().skip(1).any(|t| *t == ">") {
        Some("may have '>' only as its last token")
    } else {
        None
    };
    if let Some(why) = why {
        p.push(
            at,
            format_args!("{subject:?} is no NATS subject filter: {why}"),
        );
    }
}

/// What a JetStream stream or consumer name must not hold, as said to the operator.
const JETSTREAM_NAME_RULE: &str =
    "it must not contain '.', '*', '>', '/', '\\', whitespace or control characters";

/// Whether JetStream takes `name` for a stream or a durable consumer: async-nats refuses an
/// empty name and one with whitespace, `.`, `*` or `>` (`jetstream::is_valid_name`) before it
/// asks the server; the server also refuses `/` and `\` (names become file names) and
/// unprintable characters.
fn jetstream_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>' | '/' | '\\')
        })
}

fn key(path: &str, raw: &RawKey, p: &mut Problems<'_>) -> Option<KeyRule> {
    let t = match raw {
        RawKey::Named(n) if n == "message-id" => return Some(KeyRule::MessageId),
        RawKey::Named(n) => {
            p.push(
                path,
                format_args!("{n:?}: expected \"message-id\" or a table"),
            );
            return None;
        }
        RawKey::Table(t) => t,
    };
    match (&t.header, &t.pointer, &t.derive) {
        // Broker headers are matched exactly as written (AMQP tables and NATS headers keep case).
        (Some(h), None, None) if !h.trim().is_empty() => Some(KeyRule::Header(h.clone())),
        (Some(_), None, None) => {
            p.push(&format!("{path}.header"), "must not be empty");
            None
        }
        (None, Some(ptr), None) => Some(KeyRule::Pointer(pointer_into(
            &format!("{path}.pointer"),
            ptr,
            p,
        ))),
        (None, None, Some(f)) => Some(KeyRule::Derive(pointers(&format!("{path}.derive"), f, p))),
        _ => {
            p.push_one_of(
                path,
                &["header", "pointer", "derive"],
                "set exactly one of header, pointer or derive",
            );
            None
        }
    }
}

#[cfg(test)]
mod tests;
