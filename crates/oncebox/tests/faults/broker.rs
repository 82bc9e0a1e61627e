//! A NATS JetStream consumer on the SQLite inbox killed between the commit and the ack (the
//! `nats-before-ack` crash point, in a child process); the server delivers the message again
//! after the ack wait, and the next consumer acknowledges it as a duplicate: one effect. And
//! the same consumer SIGKILLed at random moments while it works through a backlog (mid-handler,
//! mid-commit, mid-ack): every message applied once.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use oncebox_core::consume::{Apply, KeyRule, MessageRules, Position};
use oncebox_core::{Event, ProcessError, Processed, Source};
use oncebox_nats::{Consumer, ConsumerOptions};
use oncebox_sqlite::{Inbox, InboxHandler, Options};
use oncebox_testkit::checker::check;
use oncebox_testkit::child::{Spec, killed};
use oncebox_testkit::consume::{SOURCE, Store, effect, effects_of};
use oncebox_testkit::history::{History, Outcome, key};
use oncebox_testkit::seed::Seed;
use rand::Rng;

use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, block_on, final_sqlite};

pub const NATS_BEFORE_ACK: Scenario = Scenario {
    name: "broker: killed before ack (NATS)",
    backend: "sqlite",
    run: || nats_kills(false),
};

pub const NATS_RANDOM_KILLS: Scenario = Scenario {
    name: "broker: killed at random (NATS)",
    backend: "sqlite",
    run: || nats_kills(true),
};

/// The variable that makes this binary a consumer child:
/// `<url>|<stream>|<durable>|<quarantine subject>|<db path>|<crash point or none>`.
const CHILD: &str = "ONCEBOX_FAULTS_NATS_CHILD";
const KEY_HEADER: &str = "Event-Id";
const ACK_WAIT: Duration = Duration::from_secs(1);

fn options(stream: &str, durable: &str, quarantine: &str) -> ConsumerOptions {
    let rules = MessageRules::new(
        Source::new(SOURCE).unwrap(),
        KeyRule::Header(KEY_HEADER.into()),
    );
    let mut o = ConsumerOptions::new(stream, durable, rules, quarantine);
    o.ack_wait = ACK_WAIT;
    o
}

async fn connect(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.expect("connect to NATS"))
}

/// In a child process: consumes with the crash point armed and dies at its first ack. Returns at once
/// in the parent.
pub fn child_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, stream, durable, quarantine, path, point] = parts[..] else {
        panic!("bad {CHILD}: {spec}");
    };
    if point != "none" {
        fail::cfg(point, "return").expect("arm the point");
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let inbox = Inbox::open(Options::new(path)).expect("open");
        let consumer = Consumer::new(
            InboxHandler::new(inbox, effect),
            options(stream, durable, quarantine),
        );
        let js = connect(url).await;
        let _ = consumer.run(&js, std::future::pending()).await;
    });
    std::process::exit(3);
}

/// The real `Apply`, each call recorded in the history as the consumer's answer.
struct Recorded<A> {
    inner: A,
    history: Arc<History>,
}

impl<A: Apply> Apply for Recorded<A> {
    async fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> Result<Processed, ProcessError> {
        let op = self.history.invoke(
            key(event.key.source.as_str(), event.key.event_id.as_str()),
            "v1",
            None,
        );
        let outcome = self.inner.apply(event, position).await;
        op.end(match &outcome {
            Ok(Processed::Duplicate(_)) => Outcome::Ok { replayed: true },
            Ok(_) => Outcome::Ok { replayed: false },
            Err(e) => Outcome::Info(format!("{e:?}")),
        });
        outcome
    }

    async fn watermark(
        &self,
        stream: &str,
        partition: i64,
    ) -> Result<Option<i64>, oncebox_core::Unavailable> {
        self.inner.watermark(stream, partition).await
    }
}

/// Messages published once each; child consumers die one after another, each at its first
/// ack or (`random`) SIGKILLed once the effects reach a random count; a healthy consumer then
/// takes every message, the committed-but-unacknowledged ones as duplicates.
fn nats_kills(random: bool) -> Option<Report> {
    let url = oncebox_testkit::service_url("ONCEBOX_NATS_URL")?;
    Some(block_on(Duration::from_secs(120), async {
        let js = connect(&url).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (name, subject) = (
            format!("ONCEBOX_FAULTS_{id}"),
            format!("oncebox.faults.{id}"),
        );
        let (qname, quarantine) = (
            format!("ONCEBOX_FAULTSQ_{id}"),
            format!("oncebox.faultsq.{id}"),
        );
        for (n, s) in [(&name, &subject), (&qname, &quarantine)] {
            js.create_stream(stream::Config {
                name: n.clone(),
                subjects: vec![s.clone()],
                max_age: Duration::from_secs(600),
                ..stream::Config::default()
            })
            .await
            .expect("create the stream");
        }
        let durable = format!("oncebox-faults-{id}");
        let store = Store::open(Options::new).await;
        let history = Arc::new(History::new());
        let events = scale(if random { 300 } else { 6 });
        for i in 0..events {
            let eid = format!("m{i}");
            // The publisher's hand-off: whatever happens next is the consumer's.
            let op = history.invoke(key(SOURCE, &eid), "v1", None);
            let mut headers = HeaderMap::new();
            headers.insert(KEY_HEADER, eid.as_str());
            js.publish_with_headers(subject.clone(), headers, world::body(&eid, "v1").into())
                .await
                .unwrap()
                .await
                .expect("the stream stores the message");
            op.end(Outcome::Info("published".into()));
        }
        let mut kills = 0u64;
        let mut rng = Seed::from_env("nats random kills").rng(5);
        let mut at: Vec<i64> = (0..scale(3))
            .map(|_| rng.random_range(1..events as i64 * 3 / 4))
            .collect();
        at.sort_unstable();
        for threshold in &at {
            let point = if random { "none" } else { "nats-before-ack" };
            let spec = format!(
                "{url}|{name}|{durable}|{quarantine}|{}|{point}",
                store.path().display()
            );
            let mut child = Spec::new(std::env::current_exe().unwrap())
                .env(CHILD, spec)
                .start();
            let status = if random {
                let deadline = std::time::Instant::now() + PATIENCE;
                while store.rows().await.0 < *threshold {
                    assert!(std::time::Instant::now() < deadline, "no progress");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                child.kill()
            } else {
                tokio::task::block_in_place(|| child.wait())
            };
            assert!(killed(status), "the consumer was killed: {status:?}");
            // A random kill counts if it landed with messages in the consumer's hands (delivered,
            // not acknowledged) and work left behind: one between pulls, or after the backlog
            // was done, proves nothing. (At the crash point it always left its ack.)
            let in_hand = if random {
                let stream = js.get_stream(&name).await.unwrap();
                let info = stream.clone().consumer_info(&durable).await.unwrap();
                info.num_ack_pending > 0 && store.rows().await.0 < events as i64
            } else {
                true
            };
            kills += u64::from(in_hand);
        }
        let consumer = Consumer::new(
            Recorded {
                inner: InboxHandler::new(store.inbox.clone(), effect),
                history: history.clone(),
            },
            options(&name, &durable, &quarantine),
        );
        let mut counts = consumer.counts();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn({
            let url = url.clone();
            async move {
                let js = connect(&url).await;
                consumer
                    .run(&js, async move {
                        let _ = stopped.await;
                    })
                    .await
            }
        });
        let s = js.get_stream(&name).await.unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let info = s.clone().consumer_info(&durable).await.unwrap();
            // The last crash-point child's message was committed, never acknowledged: it must
            // come back. A random kill may have fallen anywhere.
            let duplicate = random || counts.borrow_and_update().duplicates >= 1;
            if duplicate && info.num_ack_pending == 0 && info.num_pending == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not drained: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = *counts.borrow_and_update();
        let _ = stop.send(());
        running.await.unwrap().expect("the consumer ended cleanly");
        for n in [&name, &qname] {
            let _ = js.delete_stream(n).await;
        }
        let mut fin = final_sqlite(store.path(), false);
        for (k, tags) in &mut fin.effects {
            let n = effects_of(&store.inbox, &oncebox_testkit::consume::key(&k.1));
            *tags = vec![tags[0].clone(); usize::try_from(n).unwrap()];
        }
        // Every message published was applied. A hand-off to the stream is no
        // acknowledgement the checker counts (L), so a consumer that acked before its commit
        // and died would leave the stream drained and the key never applied, unseen there.
        let missing: Vec<String> = (0..events)
            .map(|i| format!("m{i}"))
            .filter(|id| {
                let tags = fin.effects.get(&key(SOURCE, id));
                tags.is_none_or(Vec::is_empty)
            })
            .collect();
        assert!(
            missing.is_empty(),
            "published, drained, never applied: {missing:?}"
        );
        Report {
            figures: check(&history.ops(), &fin),
            exercised: kills,
            what: format!(
                "{kills} SIGKILLs {}; {} redeliveries acked as duplicates, {} applied",
                if random {
                    format!("at effect counts {at:?}")
                } else {
                    "at nats-before-ack".to_owned()
                },
                done.duplicates,
                done.applied
            ),
            expected_unresolved: 0,
        }
    }))
}
