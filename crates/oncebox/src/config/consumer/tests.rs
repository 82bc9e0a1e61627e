//! `[consumers]` as the file gives them: both brokers read, each mistake named by its field.

use figment::Jail;
use oncebox_core::FingerprintMode;
use oncebox_core::json::Pointer;

use super::super::{Overrides, Settings, load};
use super::*;

#[expect(
    clippy::result_large_err,
    reason = "figment's Jail fixes the closure's error type"
)]
fn load_toml(toml: &str) -> Result<Settings, String> {
    let mut out = None;
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("oncebox.toml", toml)?;
        out = Some(load(&Overrides::default()).map_err(|e| format!("{e:#}")));
        Ok(())
    });
    out.expect("the jail ran")
}

#[test]
fn consumers_of_both_brokers_are_read() {
    let s = load_toml(
        r#"
[consumers.orders]
source = "shop"
queue = "orders"
key = "message-id"
quarantine = "oncebox.quarantine"
prefetch = 128

[consumers.payments]
source = "pay"
stream = "PAYMENTS"
subject = "payments.done"
key = { pointer = "/id" }
fingerprint = "raw"
quarantine = "payments.quarantine"
ack_wait = "1m"
max_attempts = 2
"#,
    )
    .unwrap();
    let [orders, payments] = &s.consumers[..] else {
        panic!("two consumers: {:?}", s.consumers);
    };
    assert_eq!(
        orders.broker,
        Broker::Amqp {
            queue: "orders".into(),
            quarantine: "oncebox.quarantine".into(),
            prefetch: 128
        }
    );
    assert_eq!(orders.rules.key, KeyRule::MessageId);
    assert_eq!(orders.rules.source.as_str(), "shop");
    let Broker::Nats {
        durable,
        subject,
        ack_wait,
        ..
    } = &payments.broker
    else {
        panic!("a NATS consumer: {payments:?}");
    };
    assert_eq!(durable, "oncebox-payments");
    assert_eq!(subject.as_deref(), Some("payments.done"));
    assert_eq!(*ack_wait, Duration::from_secs(60));
    assert_eq!(payments.rules.fingerprint, FingerprintMode::Raw);
    assert_eq!(payments.retry.max_attempts, 2);
    assert_eq!(
        payments.rules.key,
        KeyRule::Pointer(Pointer::parse("/id").unwrap())
    );
}

#[test]
fn bad_consumers_name_the_field() {
    for (toml, field) in [
        (
            "queue = \"q\"\nstream = \"S\"\nkey = \"message-id\"\nquarantine = \"x\"",
            "consumers.c: set exactly one of queue",
        ),
        (
            "queue = \"q\"\nquarantine = \"x\"",
            "consumers.c.key: required",
        ),
        (
            "queue = \"q\"\nkey = \"message-id\"",
            "consumers.c.quarantine: required",
        ),
        (
            "queue = \"q\"\nkey = { pointer = \"id\" }\nquarantine = \"x\"",
            "consumers.c.key.pointer",
        ),
        (
            "queue = \"q\"\nkey = \"offset\"\nquarantine = \"x\"",
            "consumers.c.key",
        ),
        (
            "queue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\nprefetch = 0",
            "consumers.c.prefetch",
        ),
        (
            "queue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\nack_wait = \"5s\"",
            "consumers.c.ack_wait",
        ),
        (
            "queue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\nretry_delay = \"0s\"",
            "consumers.c.retry_delay",
        ),
        (
            "queue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\nretry_delay = \"6m\"",
            "consumers.c.retry_delay: must be at most 5m on RabbitMQ",
        ),
        (
            "queue = \" \"\nkey = \"message-id\"\nquarantine = \"x\"",
            "consumers.c.queue: must not be empty",
        ),
        (
            "stream = \"\"\nkey = \"message-id\"\nquarantine = \"x\"",
            "consumers.c.stream: must not be empty",
        ),
    ] {
        let e = load_toml(&format!("[consumers.c]\nsource = \"shop\"\n{toml}\n")).unwrap_err();
        assert!(e.contains(field), "{field:?} missing from: {e}");
    }
    let e = load_toml("[consumers.c]\nsource = \"Shop\"\nqueue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\n").unwrap_err();
    assert!(e.contains("consumers.c.source"), "{e}");
}

/// JetStream drops a repeated `Nats-Msg-Id` within the stream's duplicate window before any
/// consumer sees it, so keyed by that id a changed payload is never refused as a conflict: said
/// for NATS, not for RabbitMQ (whose message id nothing drops), nor for a payload key.
#[test]
fn a_nats_consumer_keyed_by_message_id_is_warned_of_the_duplicate_window() {
    let toml = |broker: &str, key: &str| {
        format!(
            "[sources.shop]\nsignature = \"none\"\n\n[consumers.c]\nsource = \"shop\"\n{broker}\n\
             key = {key}\nquarantine = \"q.x\"\n"
        )
    };
    let warned = |broker: &str, key: &str| {
        let s = load_toml(&toml(broker, key)).unwrap();
        s.warnings
            .iter()
            .any(|w| w.starts_with("consumers.c.key:") && w.contains("duplicate window"))
    };
    assert!(warned("stream = \"S\"", "\"message-id\""));
    assert!(!warned("stream = \"S\"", "{ pointer = \"/id\" }"));
    assert!(!warned("queue = \"q\"", "\"message-id\""));
}

/// async-nats refuses a stream or durable name with `.`, `*`, `>` or whitespace before it asks
/// the server (which also refuses `/` and `\`), at every connection: `consume` reconnected for
/// ever. Refused when the file is read, under the field; a consumer whose own name makes a
/// default durable JetStream refuses is told to set `durable`.
#[test]
fn jetstream_names_the_client_refuses_are_refused_by_field() {
    let nats = |name: &str, extra: &str| {
        format!(
            "[consumers.{name}]\nsource = \"shop\"\nkey = \"message-id\"\n\
             quarantine = \"q.x\"\n{extra}\n"
        )
    };
    for bad in [
        "ORDERS.EU",
        "ORD*",
        "ORD>",
        "OR DERS",
        "OR/DERS",
        "OR\\\\DERS",
        "OR\\tDERS",
    ] {
        let e = load_toml(&nats("c", &format!("stream = \"{bad}\""))).unwrap_err();
        assert!(
            e.contains("consumers.c.stream: ") && e.contains("is no JetStream name"),
            "{bad}: {e}"
        );
        let e = load_toml(&nats("c", &format!("stream = \"S\"\ndurable = \"{bad}\""))).unwrap_err();
        assert!(
            e.contains("consumers.c.durable: ") && e.contains("is no JetStream name"),
            "{bad}: {e}"
        );
    }
    // The default durable, `oncebox-<name>`, carries the consumer's name.
    let e = load_toml(&nats("\"orders.eu\"", "stream = \"S\"")).unwrap_err();
    assert!(
        e.contains("consumers.orders.eu: the consumer's name makes the default durable \"oncebox-orders.eu\"")
            && e.contains("set durable"),
        "{e}"
    );
    // Set, it is the durable's name that counts.
    let s = load_toml(&nats(
        "\"orders.eu\"",
        "stream = \"S\"\ndurable = \"oncebox-orders-eu\"",
    ))
    .unwrap();
    let Broker::Nats { durable, .. } = &s.consumers[0].broker else {
        panic!("a NATS consumer: {:?}", s.consumers);
    };
    assert_eq!(durable, "oncebox-orders-eu");
    // A RabbitMQ queue may hold dots.
    load_toml(&nats("\"orders.eu\"", "queue = \"orders.eu\"")).unwrap();
}

/// A subject filter the server refuses when the durable is made set the consumer up again
/// every 30 s for ever, saying only that it stopped: refused when the file is read.
#[test]
fn a_subject_filter_that_is_no_nats_subject_is_refused_by_field() {
    let nats = |subject: &str| {
        format!(
            "[consumers.c]\nsource = \"shop\"\nkey = \"message-id\"\nquarantine = \"q.x\"\n\
             stream = \"S\"\nsubject = \"{subject}\"\n"
        )
    };
    for (bad, why) in [
        ("orders. paid", "spaces, tabs or line breaks"),
        ("orders.\\tpaid", "spaces, tabs or line breaks"),
        ("orders..paid", "'..'"),
        (".orders", "'..'"),
        ("orders.", "'..'"),
        ("orders.>.paid", "'>' only as its last token"),
    ] {
        let e = load_toml(&nats(bad)).unwrap_err();
        assert!(
            e.contains("consumers.c.subject: ") && e.contains(why),
            "{bad}: {e}"
        );
    }
    for good in ["orders.paid", "orders.*", "orders.>", ">", "*.paid.>"] {
        load_toml(&nats(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

/// Two consumers of one queue, or of one stream through one durable: refused at the later,
/// naming the earlier. One stream through two durables is two readers of every message, each
/// its own: allowed.
#[test]
fn two_consumers_of_one_queue_or_durable_are_refused() {
    let amqp = r#"
[consumers.a]
source = "shop"
queue = "orders"
key = "message-id"
quarantine = "q"

[consumers.b]
source = "shop2"
queue = "orders"
key = "message-id"
quarantine = "q"
"#;
    let err = load_toml(amqp).unwrap_err();
    assert!(err.contains("consumers.b.queue"), "{err}");
    assert!(
        err.contains("consumers.a reads queue \"orders\" too"),
        "{err}"
    );
    let nats = |durable_b: &str| {
        format!(
            r#"
[consumers.a]
source = "pay"
stream = "PAYMENTS"
durable = "one"
key = {{ pointer = "/id" }}
quarantine = "payments.quarantine"

[consumers.b]
source = "pay"
stream = "PAYMENTS"
durable = "{durable_b}"
key = {{ pointer = "/id" }}
quarantine = "payments.quarantine"
"#
        )
    };
    let err = load_toml(&nats("one")).unwrap_err();
    assert!(err.contains("consumers.b.durable"), "{err}");
    assert!(err.contains("through durable \"one\""), "{err}");
    let two = load_toml(&nats("two")).expect("one stream, two durables");
    assert_eq!(two.consumers.len(), 2);
}
