//! Relays on several nodes claiming from one outbox: `FOR UPDATE SKIP LOCKED` passes over rows
//! another claimer holds, so concurrent claims split a backlog, never share a delivery, and
//! never queue behind each other.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use oncebox_core::relay_store::{Claimed, DeliveryFilter, DeliveryStore};
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Clock, ManualClock, Processed};
use oncebox_postgres::Inbox;
use oncebox_postgres::sqlx;
use oncebox_testkit::{EPOCH, event, run};
use tokio::sync::Barrier;

use crate::harness;

const LEASE: Duration = Duration::from_secs(30);
/// Ample for a claim that does not wait on locks; one that did would block until the holder
/// ends, which the tests below never do before the deadline.
const PROMPT: Duration = Duration::from_secs(10);

/// A new event from `shop` routed to `routes`, as the gateway hands it over.
pub fn routed(id: &str, routes: &[&str]) -> Ingest {
    Ingest {
        event: event("shop", id, 1),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: b"stale".to_vec(),
        routes: routes.iter().map(|r| (*r).to_owned()).collect(),
    }
}

/// Ingests `n` events routed to `hooks`, concurrently, as many senders would.
async fn backlog(inbox: &Inbox, n: usize) {
    let all = (0..n).map(|i| inbox.ingest(routed(&format!("evt-{i}"), &["hooks"])));
    for out in join_all(all).await {
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
    }
}

/// Two nodes on one schema: each has its own pool, as two relay processes would.
async fn two_nodes(clock: &ManualClock) -> (Inbox, Inbox) {
    let schema = harness::schema();
    let a = Inbox::open(harness::options(&schema, clock))
        .await
        .expect("open");
    let b = Inbox::open(harness::options(&schema, clock))
        .await
        .expect("open");
    (a, b)
}

fn ids(claimed: &[Claimed]) -> Vec<i64> {
    claimed.iter().map(|c| c.id).collect()
}

#[test]
fn claim_passes_over_deliveries_another_claimer_holds_without_waiting_for_them() {
    if harness::url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let (a, b) = two_nodes(&clock).await;
        backlog(&a, 5).await;
        // Another claimer in the middle of its statement: the two oldest rows locked.
        let mut holder = a.pool().begin().await.expect("begin");
        let held: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM oncebox_outbox ORDER BY id LIMIT 2 FOR UPDATE")
                .fetch_all(&mut *holder)
                .await
                .expect("lock");
        let now = clock.now();
        let first = tokio::time::timeout(PROMPT, b.claim(now, 10, LEASE, &[]))
            .await
            .expect("a claim never waits for a locked row")
            .expect("claim");
        assert_eq!(first.len(), 3, "the three rows nobody holds");
        assert!(ids(&first).iter().all(|id| !held.contains(id)), "{held:?}");
        holder.rollback().await.expect("rollback");
        let second = b.claim(now, 10, LEASE, &[]).await.expect("claim");
        assert_eq!(ids(&second), held, "free again once the holder ended");
    });
}

/// One node's claim in a round: what it got, and when its statement started and ended.
type Timed = (Vec<Claimed>, Instant, Instant);

#[test]
fn concurrent_claimers_split_a_backlog_without_claiming_a_delivery_twice() {
    if harness::url().is_none() {
        return;
    }
    run(async {
        const EVENTS: usize = 240;
        const BATCH: usize = 7;
        let clock = ManualClock::new(EPOCH);
        let (a, b) = two_nodes(&clock).await;
        backlog(&a, EVENTS).await;
        let now = clock.now();
        // Both claim at once each round (the barrier), and stop after the first round in which
        // both found nothing.
        let barrier = Arc::new(Barrier::new(2));
        let rounds: Arc<Mutex<Vec<[Option<Timed>; 2]>>> = Arc::default();
        let node = |me: usize, inbox: Inbox| {
            let (barrier, rounds) = (Arc::clone(&barrier), Arc::clone(&rounds));
            tokio::spawn(async move {
                for round in 0.. {
                    barrier.wait().await;
                    let start = Instant::now();
                    let got = inbox.claim(now, BATCH, LEASE, &[]).await.expect("claim");
                    let end = Instant::now();
                    {
                        let mut rounds = rounds.lock().expect("lock");
                        if rounds.len() <= round {
                            rounds.push([None, None]);
                        }
                        rounds[round][me] = Some((got, start, end));
                    }
                    barrier.wait().await;
                    let rounds = rounds.lock().expect("lock");
                    let both_empty = rounds[round]
                        .iter()
                        .all(|r| r.as_ref().is_some_and(|(got, _, _)| got.is_empty()));
                    if both_empty {
                        return;
                    }
                }
            })
        };
        let (ta, tb) = (node(0, a.clone()), node(1, b));
        ta.await.expect("node a");
        tb.await.expect("node b");
        let rounds: Vec<[Timed; 2]> = std::mem::take(&mut *rounds.lock().expect("lock"))
            .into_iter()
            .map(|[x, y]| [x.expect("a claimed"), y.expect("b claimed")])
            .collect();
        let mut seen = BTreeSet::new();
        let mut tokens = BTreeSet::new();
        let (mut both_got_rows, mut overlapped) = (0, 0);
        for [(x, xs, xe), (y, ys, ye)] in &rounds {
            for c in x.iter().chain(y) {
                assert!(seen.insert(c.id), "delivery {} claimed twice", c.id);
                assert!(tokens.insert(c.token), "token {} handed out twice", c.token);
            }
            if !x.is_empty() && !y.is_empty() {
                both_got_rows += 1;
                if xs < ye && ys < xe {
                    overlapped += 1;
                }
            }
        }
        let listed = a
            .deliveries(DeliveryFilter {
                limit: 500,
                ..DeliveryFilter::default()
            })
            .await
            .expect("deliveries");
        let all: BTreeSet<i64> = listed.items.iter().map(|d| d.id).collect();
        assert_eq!(all.len(), EVENTS);
        assert_eq!(seen, all, "together the claimers took every delivery");
        assert!(
            overlapped > 0,
            "no round had both claims in flight at once ({both_got_rows} rounds where both got rows)"
        );
    });
}

#[test]
fn a_delivery_whose_stored_key_no_longer_validates_is_parked_dead_not_handed_out() {
    if harness::url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let (a, _) = two_nodes(&clock).await;
        // Older than the valid one, so it would head every claim if it were left due.
        sqlx::query(
            "INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type,
               source, event_id, created_at, next_attempt_at)
             VALUES ('hooks', 'Not A Source:x', '', 'text/plain', 'Not A Source', 'x', $1, $1)",
        )
        .bind(clock.now().millis())
        .execute(a.pool())
        .await
        .expect("insert");
        clock.advance(Duration::from_secs(1));
        backlog(&a, 1).await;
        let got = a.claim(clock.now(), 1, LEASE, &[]).await.expect("claim");
        assert_eq!(got, [], "the invalid row took the slot, and was parked");
        let (state, error, token): (String, String, Option<i64>) = sqlx::query_as(
            "SELECT state, last_error, lease_token FROM oncebox_outbox WHERE source = 'Not A Source'",
        )
        .fetch_one(a.pool())
        .await
        .expect("parked row");
        assert_eq!((state.as_str(), token), ("dead", None));
        assert!(
            error.starts_with("stored key no longer validates"),
            "{error}"
        );
        let next = a.claim(clock.now(), 1, LEASE, &[]).await.expect("claim");
        assert_eq!(
            next.iter().map(|c| c.key.to_string()).collect::<Vec<_>>(),
            ["shop:evt-0"]
        );
    });
}

/// Two due deliveries and an inbox whose connections pass through a fault proxy that acts only
/// on the claim's execution: the one request that carries the lease's end as a parameter (an
/// 8-byte big-endian integer). The statement is prepared before, so its text is no marker: the
/// answer to its preparation would be dropped, before anything ran.
async fn through_proxy(url: &str) -> Proxied {
    let clock = ManualClock::new(EPOCH);
    let schema = harness::schema();
    let direct = Inbox::open(harness::options(&schema, &clock))
        .await
        .expect("open");
    backlog(&direct, 2).await;
    let lease_end = clock.now().plus(LEASE).millis().to_be_bytes().to_vec();
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (auth, hostpath) = rest.rsplit_once('@').unwrap_or(("", rest));
    let slash = hostpath.find('/').unwrap_or(hostpath.len());
    let server: std::net::SocketAddr = tokio::net::lookup_host(&hostpath[..slash])
        .await
        .expect("the server's address")
        .next()
        .expect("an address");
    let proxy = oncebox_testkit::proxy::Proxy::start_with_marker(server, Some(lease_end)).await;
    let at = if auth.is_empty() { "" } else { "@" };
    let via = oncebox_testkit::proxy::plaintext(&format!(
        "{scheme}://{auth}{at}{}{}",
        proxy.addr(),
        &hostpath[slash..]
    ));
    let options = oncebox_postgres::Options::new(via)
        .schema(&schema)
        .clock(Arc::new(clock.clone()));
    let relay = Inbox::open(options).await.expect("open through the proxy");
    Proxied {
        clock,
        direct,
        proxy,
        relay,
    }
}

/// Two due deliveries, an inbox on their schema and one whose connections pass the proxy.
struct Proxied {
    clock: ManualClock,
    direct: Inbox,
    proxy: oncebox_testkit::proxy::Proxy,
    relay: Inbox,
}

/// A claim whose answer is lost after the server committed it (the connection cut as the rows
/// came back): the claimer finds the rows it leased by the claim's id, so they are sent now,
/// not left in flight under tokens nobody holds until their lease runs out and then taken over
/// as possibly sent (which parks a delivery on a route that ignores the key `uncertain`).
#[test]
fn a_claim_whose_answer_is_lost_finds_the_rows_it_leased() {
    lost_claim_found_by_its_id(oncebox_testkit::proxy::Mode::DropReply);
}

/// The same when a pooler in between (PgBouncer) lost its server connection after the server
/// committed the claim and says so with an error of class 08 of its own, in the answer's
/// place: that is a lost answer too, not a refusal that changed nothing.
#[test]
fn a_claim_answered_by_a_poolers_connection_error_finds_the_rows_it_leased() {
    let mut fields = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08P01"),
        (b'M', "server conn crashed?"),
    ] {
        fields.push(tag);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut error = vec![b'E'];
    error.extend_from_slice(&(fields.len() as i32 + 4).to_be_bytes());
    error.extend_from_slice(&fields);
    lost_claim_found_by_its_id(oncebox_testkit::proxy::Mode::AnswerInstead(error));
}

fn lost_claim_found_by_its_id(mode: oncebox_testkit::proxy::Mode) {
    use oncebox_testkit::proxy::{Mode, Stats};

    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let Proxied {
            clock,
            proxy,
            relay,
            ..
        } = through_proxy(&url).await;
        proxy.set(mode);
        let claimed = relay.claim(clock.now(), 10, LEASE, &[]).await;
        proxy.set(Mode::Pass);
        assert_eq!(
            Stats::get(&proxy.stats.dropped_replies),
            1,
            "the answer was lost"
        );
        let claimed = claimed.expect("the claim's rows, found by its id");
        assert_eq!(claimed.len(), 2);
        assert!(claimed.iter().all(|c| !c.taken_over), "{claimed:?}");
        // They are this claimer's: its record of an attempt is taken.
        let now = clock.now();
        for c in &claimed {
            let attempt = oncebox_core::relay_store::AttemptRecord {
                started_at: now,
                duration: Duration::ZERO,
                status: Some(200),
                error: None,
            };
            let delivered = oncebox_core::delivery::Verdict::Delivered;
            DeliveryStore::record(&relay, c, attempt, delivered, now)
                .await
                .expect("recorded under the claim's lease");
        }
    });
}

/// A claim cut off while the server still works on it (a wait the session's `lock_timeout`
/// does not bound: a slow trigger, the disk): the look by its id finds nothing, and the
/// statement commits after it. The next claim gives those rows
/// back and leases them as never sent, instead of leaving them in flight until their lease
/// runs out and taking them over as possibly sent.
#[test]
fn a_claim_that_commits_after_its_connection_was_cut_is_given_back_by_the_next() {
    use oncebox_testkit::proxy::{Mode, Stats};

    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let Proxied {
            clock,
            direct,
            proxy,
            relay,
        } = through_proxy(&url).await;
        // The claim's UPDATE waits for an advisory lock the test holds (a trigger asks for it,
        // with no limit on the wait: a wait the session's `lock_timeout` does not end), while
        // the look by id reads on. Advisory locks are the database's: the key is this test's
        // own.
        let key: i64 = rand::random();
        sqlx::raw_sql(&format!(
            "CREATE FUNCTION hold_claims() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM set_config('lock_timeout', '0', true);
                        PERFORM pg_advisory_xact_lock_shared({key}); RETURN NEW; END $$;
             CREATE TRIGGER hold_claims BEFORE UPDATE ON oncebox_outbox
               FOR EACH ROW EXECUTE FUNCTION hold_claims()"
        ))
        .execute(direct.pool())
        .await
        .expect("the trigger");
        let mut holder = direct.pool().begin().await.expect("begin");
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .expect("lock");
        proxy.set(Mode::CutRequest);
        let lost = relay.claim(clock.now(), 10, LEASE, &[]).await;
        proxy.set(Mode::Pass);
        assert_eq!(
            Stats::get(&proxy.stats.cut_requests),
            1,
            "the claim was cut"
        );
        assert!(lost.is_err(), "nothing found by its id yet: {lost:?}");
        holder.commit().await.expect("release the lock");
        // The cut claim runs now, on the server, for nobody.
        let in_flight = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM oncebox_outbox WHERE state = 'in_flight'",
            )
            .fetch_one(direct.pool())
            .await
            .expect("count")
        };
        let deadline = Instant::now() + PROMPT;
        while in_flight().await != 2 {
            assert!(Instant::now() < deadline, "the cut claim never committed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Well within the lost claim's lease, the next claim has the rows, as never sent.
        let again = relay
            .claim(clock.now(), 10, LEASE, &[])
            .await
            .expect("claim");
        assert_eq!(again.len(), 2, "{again:?}");
        assert!(again.iter().all(|c| !c.taken_over), "{again:?}");
    });
}
