//! Which message a key names: a key header sent twice names none and is quarantined, and of a
//! key's two payloads in hand at once the one published first is kept, however their handlers
//! interleave; a key derived from business fields makes a fact in a new envelope one event.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use oncebox_core::Event;
use oncebox_core::consume::{Apply, KeyRule, MessageRules, from_fn};
use oncebox_core::store::EventStore;
use oncebox_nats::Consumer;
use oncebox_testkit::consume::key;
use oncebox_testkit::{run, service_url};
use tokio::sync::Notify;

use crate::support::{KEY_HEADER, World, start};

/// `Event-Id: a` and `Event-Id: b` on one message: read as its first value, `b`'s event was
/// applied under `a`'s key. Refused as the gateway refuses it.
#[test]
fn a_key_header_sent_twice_is_quarantined_not_read_as_its_first_value() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut headers = HeaderMap::new();
        headers.append(KEY_HEADER, "evt_a");
        headers.append(KEY_HEADER, "evt_b");
        w.publish_with(headers, r#"{"amount":1}"#).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;
        assert_eq!((done.applied, done.quarantined), (0, 1), "{done:?}");
        assert_eq!(w.quarantined().await, ["event-id-invalid"]);
        for id in ["evt_a", "evt_b"] {
            assert_eq!(w.db.effects(id), 0, "{id}");
        }
        w.cleanup().await;
    });
}

/// A key sent twice with different payloads, both in hand at once (a pull brings many): the
/// one published first is the one kept, the later refused as `key-reused` (G4). The handler
/// holds each first payload until its key's later one has reached the handler (or 100 ms have
/// passed), so a consumer that let both run side by side would commit the later one first;
/// the consumer's arrival order (`Arrivals`) runs the later only after the first settled.
#[test]
fn the_first_published_payload_of_a_key_wins_within_one_pull() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        const PAIRS: usize = 20;
        let w = World::new(&url).await;
        for i in 0..PAIRS {
            let id = format!("pair-{i}");
            w.publish(Some(&id), r#"{"v":1}"#).await;
            w.publish(Some(&id), r#"{"v":2}"#).await;
        }
        let inner = Arc::new(w.db.checked());
        let later_in = Arc::new(Mutex::new(HashSet::new()));
        let entered = Arc::new(Notify::new());
        let overtaken = Arc::new(Mutex::new(0_usize));
        // First payloads handled after the consumer was handed their key's later one (published
        // right after, so next in the stream: pair i's at sequence 2i + 2 of this fresh
        // stream): the two were in hand at once.
        let together = Arc::new(Mutex::new(0_usize));
        let apply = {
            let (overtaken, together) = (overtaken.clone(), together.clone());
            let (js, stream, durable) = (w.js.clone(), w.stream.clone(), w.durable.clone());
            from_fn(move |event: Event, position| {
                let (inner, later_in, entered) = (inner.clone(), later_in.clone(), entered.clone());
                let (overtaken, together) = (overtaken.clone(), together.clone());
                let (js, stream, durable) = (js.clone(), stream.clone(), durable.clone());
                async move {
                    let id = event.key.event_id.as_str().to_owned();
                    if event.payload == br#"{"v":2}"# {
                        later_in.lock().unwrap().insert(id);
                        entered.notify_waiters();
                    } else {
                        let s = js.get_stream(&stream).await.unwrap();
                        let info = s.consumer_info(&durable).await.unwrap();
                        let pair: u64 = id.strip_prefix("pair-").unwrap().parse().unwrap();
                        if info.delivered.stream_sequence >= 2 * pair + 2 {
                            *together.lock().unwrap() += 1;
                        }
                        let waited = tokio::time::timeout(Duration::from_millis(100), async {
                            loop {
                                let next = entered.notified();
                                if later_in.lock().unwrap().contains(&id) {
                                    return;
                                }
                                next.await;
                            }
                        });
                        if waited.await.is_ok() {
                            *overtaken.lock().unwrap() += 1;
                        }
                    }
                    inner.apply(event, position).await
                }
            })
        };
        let mut consumer = start(&url, Consumer::new(apply, w.options()));
        w.wait(&mut consumer, |c| c.acked >= 2 * PAIRS as u64).await;
        consumer.stop().await;
        let mut later = 0;
        for i in 0..PAIRS {
            let id = format!("pair-{i}");
            let stored = EventStore::event(&w.db.inbox, &key(&id)).await.unwrap();
            later += usize::from(stored.expect("stored").payload != br#"{"v":1}"#);
        }
        let overtaken = *overtaken.lock().unwrap();
        let together = *together.lock().unwrap();
        assert!(
            together > 0,
            "no first payload was handled with its later one in hand: nothing could overtake it"
        );
        assert_eq!(
            (later, overtaken),
            (0, 0),
            "of {PAIRS} keys, the later payload reached the handler before the first settled \
             for {overtaken} and was kept for {later}"
        );
        w.cleanup().await;
    });
}

/// A key derived from business fields (`key = { derive = [...] }`): the same fact republished
/// in a new envelope (another `sent_at`, no key header at all) is one event with one effect, its
/// copy answered as a duplicate; another fact is another event.
#[test]
fn a_key_derived_from_business_fields_makes_a_fact_in_a_new_envelope_one_event() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for body in [
            r#"{"order":"o1","kind":"paid","sent_at":1}"#,
            r#"{"order":"o1","kind":"paid","sent_at":2}"#,
            r#"{"order":"o2","kind":"paid","sent_at":3}"#,
        ] {
            w.publish(None, body).await;
        }
        let mut options = w.options();
        let fields = ["/order", "/kind"].map(|p| p.parse().unwrap()).to_vec();
        options.rules = MessageRules::new(options.rules.source.clone(), KeyRule::Derive(fields));
        let mut consumer = start(&url, Consumer::new(w.db.checked(), options));
        w.wait(&mut consumer, |c| c.acked >= 3).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;
        assert_eq!((done.applied, done.duplicates), (2, 1), "{done:?}");
        let effects: i64 =
            w.db.inbox
                .read(|c| c.query_row("SELECT count(*) FROM effects", [], |r| r.get(0)))
                .await
                .unwrap();
        assert_eq!(effects, 2);
        w.cleanup().await;
    });
}
