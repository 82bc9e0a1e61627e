//! What `oncebox check` says of each `[consumers]` entry: where it reads, for which source, where
//! its key comes from, where poison messages go and how it paces retries.

use std::fmt::Write as _;

use humantime::format_duration;
use oncebox_core::consume::KeyRule;

use super::{Broker, ConsumerSpec};

/// One consumer, in `check`'s text: a heading line and its details, indented as routes are.
pub(in crate::config) fn text(out: &mut String, c: &ConsumerSpec) {
    let _ = writeln!(
        out,
        "  {} <- {} for source {}",
        c.name,
        reads(&c.broker),
        c.rules.source
    );
    let _ = writeln!(out, "    key          {}", key(&c.rules.key));
    let _ = writeln!(out, "    quarantine   {}", quarantine(&c.broker));
    let _ = writeln!(
        out,
        "    retries      {} deliveries of a failing handler, {} apart; uncertain keys every {}",
        c.retry.max_attempts,
        format_duration(c.retry.delay),
        format_duration(c.retry.uncertain_delay),
    );
    let _ = writeln!(out, "    in hand      {}", in_hand(&c.broker));
}

/// One consumer for `check --output json`.
pub(in crate::config) fn json(c: &ConsumerSpec) -> serde_json::Value {
    let (broker, reads) = match &c.broker {
        Broker::Amqp { queue, .. } => ("amqp", serde_json::json!({ "queue": queue })),
        Broker::Nats {
            stream,
            subject,
            durable,
            ..
        } => (
            "nats",
            serde_json::json!({ "stream": stream, "subject": subject, "durable": durable }),
        ),
    };
    let quarantine = match &c.broker {
        Broker::Amqp { quarantine, .. } | Broker::Nats { quarantine, .. } => quarantine,
    };
    serde_json::json!({
        "name": c.name,
        "broker": broker,
        "reads": reads,
        "source": c.rules.source.as_str(),
        "key": key(&c.rules.key),
        "max_body": c.rules.max_body,
        "quarantine": quarantine,
        "max_attempts": c.retry.max_attempts,
        "retry_delay_ms": c.retry.delay.as_millis(),
        "uncertain_delay_ms": c.retry.uncertain_delay.as_millis(),
    })
}

fn reads(b: &Broker) -> String {
    match b {
        Broker::Amqp { queue, .. } => format!("RabbitMQ queue {queue}"),
        Broker::Nats {
            stream,
            subject,
            durable,
            ..
        } => {
            let only = subject
                .as_deref()
                .map(|s| format!(", subjects {s}"))
                .unwrap_or_default();
            format!("NATS stream {stream}{only} (durable {durable})")
        }
    }
}

fn quarantine(b: &Broker) -> String {
    match b {
        Broker::Amqp {
            quarantine, queue, ..
        } => {
            format!("exchange {quarantine}, routing key {queue}")
        }
        Broker::Nats { quarantine, .. } => format!("subject {quarantine}"),
    }
}

fn in_hand(b: &Broker) -> String {
    match b {
        Broker::Amqp { prefetch, .. } => format!("prefetch {prefetch}, applied side by side"),
        Broker::Nats {
            batch, ack_wait, ..
        } => format!(
            "batches of {batch}, ack wait {}",
            format_duration(*ack_wait)
        ),
    }
}

fn key(rule: &KeyRule) -> String {
    match rule {
        KeyRule::Header(h) => format!("header {h}"),
        KeyRule::MessageId => "the message id (AMQP message_id, NATS Nats-Msg-Id)".to_owned(),
        KeyRule::Pointer(p) => format!("JSON {p}"),
        KeyRule::Derive(fields) => {
            let fields: Vec<String> = fields.iter().map(ToString::to_string).collect();
            format!("derived from {}", fields.join(", "))
        }
        other => format!("{other:?}"),
    }
}
