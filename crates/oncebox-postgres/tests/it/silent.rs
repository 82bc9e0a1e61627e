//! Connections whose network path goes silent under them, with neither a reset nor a FIN (a
//! failover that moved the server's address, a firewall that forgot the connection): each of
//! oncebox's own waits there ends after `lost_after`, the connection is closed rather than
//! taken back into the pool, and the next try passes on a new one. Before, a batch worker, a
//! relay's claim or a lease's write waited for ever, and its pooled connection with it.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::EventStore;
use oncebox_core::{
    Begun, Clock, LeaseError, ManualClock, ProcessError, Processed, Response, Retention,
    Unavailable,
};
use oncebox_postgres::{Inbox, Options};
use oncebox_testkit::child::until_async;
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::{EPOCH, event, run};

use crate::claims::routed;
use crate::harness;

/// Short, so that the tests take seconds; a batch's lock wait and a connection's acquisition
/// are bounded by the deadline, and `lost_after` must be at least twice it.
const DEADLINE: Duration = Duration::from_secs(1);
const LOST_AFTER: Duration = Duration::from_secs(2);
/// Far past every bound here: a wait that reaches it hung.
const HUNG: Duration = Duration::from_secs(60);

/// An inbox on `schema` whose connections pass a proxy that strands a connection at the first
/// bytes containing `marker`, once told to; one batch worker, so a worker held shows.
async fn proxied(url: &str, schema: &str, clock: &ManualClock, marker: &[u8]) -> (Proxy, Inbox) {
    let server = tokio::net::lookup_host(crate::proxy::server(url))
        .await
        .expect("the server's address")
        .next()
        .expect("an address");
    let proxy = Proxy::start_with_marker(server, Some(marker.to_vec())).await;
    let via = crate::proxy::via(url, &proxy.addr().to_string());
    let options = Options::new(oncebox_testkit::proxy::plaintext(&via))
        .schema(schema)
        .clock(Arc::new(clock.clone()))
        .deadline(DEADLINE)
        .lost_after(LOST_AFTER)
        .batch_workers(1)
        .max_connections(2);
    let inbox = Inbox::open(options).await.expect("open through the proxy");
    (proxy, inbox)
}

/// Waits until every stranded connection was closed by its client: given up on, not kept.
async fn all_closed(proxy: &Proxy) {
    until_async("the stranded connection closed", HUNG, || {
        Stats::get(&proxy.stats.stranded_closed) == Stats::get(&proxy.stats.stranded)
    })
    .await;
}

#[test]
fn a_batch_whose_connection_goes_silent_ends_and_its_worker_serves_the_next() {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let clock = ManualClock::new(EPOCH);
        let id = "into-the-void";
        let (proxy, inbox) = proxied(&url, &harness::schema(), &clock, id.as_bytes()).await;
        let first = inbox.ingest(routed("before", &["hooks"])).await;
        assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");

        proxy.set(Mode::Strand);
        let lost = tokio::time::timeout(HUNG, inbox.ingest(routed(id, &["hooks"]))).await;
        let lost = lost.expect("the request is answered");
        assert!(
            matches!(lost, Err(ProcessError::Unavailable(_))),
            "{lost:?}"
        );
        // Answered at its deadline, perhaps before its worker sent the statement.
        until_async("the batch's statement went into the void", HUNG, || {
            Stats::get(&proxy.stats.stranded) == 1
        })
        .await;
        proxy.set(Mode::Pass);

        // The only worker serves again once its batch is given up on; until then each try
        // runs out its deadline.
        let retried = tokio::time::timeout(HUNG, async {
            loop {
                match inbox.ingest(routed(id, &["hooks"])).await {
                    Err(ProcessError::Unavailable(_)) => continue,
                    other => break other,
                }
            }
        })
        .await
        .expect("the worker serves again");
        // Stored (by this try, or by an earlier one whose caller had given up on it before
        // its batch committed: then a duplicate).
        assert!(
            matches!(retried, Ok(Processed::Applied(_) | Processed::Duplicate(_))),
            "{retried:?}"
        );
        all_closed(&proxy).await;
    });
}

#[test]
fn a_claim_whose_connection_goes_silent_ends_and_the_next_takes_the_delivery() {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let clock = ManualClock::new(EPOCH);
        let schema = harness::schema();
        let direct = Inbox::open(harness::options(&schema, &clock))
            .await
            .expect("open");
        let queued = direct.ingest(routed("evt", &["hooks"])).await;
        assert!(matches!(queued, Ok(Processed::Applied(_))), "{queued:?}");
        // The claim binds its lease's end: a value only the claim sends.
        let lease = Duration::from_secs(37);
        let lease_end = clock.now().plus(lease).millis().to_be_bytes();
        let (proxy, relay) = proxied(&url, &schema, &clock, &lease_end).await;

        proxy.set(Mode::Strand);
        let claim = relay.claim(clock.now(), 10, lease, &[]);
        let lost = tokio::time::timeout(HUNG, claim).await;
        let lost = lost.expect("the claim ends");
        assert!(lost.is_err(), "{lost:?}");
        assert_eq!(Stats::get(&proxy.stats.stranded), 1, "the claim was sent");
        proxy.set(Mode::Pass);

        let claimed = relay.claim(clock.now(), 10, lease, &[]).await;
        let claimed = claimed.expect("the next claim passes");
        assert_eq!(claimed.len(), 1, "the lost claim never reached the server");
        all_closed(&proxy).await;
    });
}

#[test]
fn a_lease_write_whose_connection_goes_silent_is_unknown_and_done_on_retry() {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let clock = ManualClock::new(EPOCH);
        let body = "charged-into-the-void";
        let (proxy, inbox) = proxied(&url, &harness::schema(), &clock, body.as_bytes()).await;
        let begun = inbox.begin(event("shop", "paid", 1), HUNG).await;
        let Ok(Begun::Leased(lease)) = begun else {
            panic!("{begun:?}");
        };

        proxy.set(Mode::Strand);
        let complete = inbox.complete(&lease, Response::completed(body));
        let lost = tokio::time::timeout(HUNG, complete).await;
        let lost = lost.expect("the write ends");
        // It may have reached the server, for all the holder knows.
        assert!(
            matches!(
                lost,
                Err(LeaseError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{lost:?}"
        );
        assert_eq!(Stats::get(&proxy.stats.stranded), 1, "the write was sent");
        proxy.set(Mode::Pass);

        let done = inbox.complete(&lease, Response::completed(body)).await;
        done.expect("completed on a new connection");
        all_closed(&proxy).await;
    });
}

/// The gateway purges in a loop of its own: a purge stopped on a silent connection stopped
/// retention for the life of the process, without a word.
#[test]
fn a_purge_whose_connection_goes_silent_ends_and_the_next_purges() {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        let clock = ManualClock::new(EPOCH);
        // The purge's scan, as its statement is first sent on a connection.
        let scan = b"completed_at, received_at FROM oncebox_inbox";
        let (proxy, inbox) = proxied(&url, &harness::schema(), &clock, scan).await;
        let done = inbox.ingest(routed("old", &[])).await;
        assert!(matches!(done, Ok(Processed::Applied(_))), "{done:?}");
        let retention = Retention::new(Duration::from_secs(60));
        clock.advance(Duration::from_secs(3600));

        proxy.set(Mode::Strand);
        let purge = inbox.purge(clock.now(), &retention);
        let lost = tokio::time::timeout(HUNG, purge).await;
        assert!(lost.expect("the purge ends").is_err());
        assert_eq!(Stats::get(&proxy.stats.stranded), 1, "the scan was sent");
        proxy.set(Mode::Pass);

        let purged = inbox.purge(clock.now(), &retention).await;
        assert_eq!(purged.expect("the next purge passes"), 1);
        all_closed(&proxy).await;
    });
}

fn nothing<'t>(
    _tx: &'t mut oncebox_postgres::Tx,
    _event: &'t oncebox_core::Event,
) -> futures::future::BoxFuture<'t, Result<Response, oncebox_postgres::HandlerError>> {
    Box::pin(async { Ok(Response::completed("ok")) })
}

/// A broker consumer's conflict moves the offset watermark in a transaction of its own after
/// the record's: on a silent connection it waited for good, the consumer's message with it.
#[test]
fn a_consumers_watermark_whose_connection_goes_silent_is_unknown_and_moved_on_retry() {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        use oncebox_core::consume::{Apply, Position};
        let clock = ManualClock::new(EPOCH);
        // The watermark's statement, as the settling transaction sends it.
        let moved = b"oncebox_offsets AS o";
        let (proxy, inbox) = proxied(&url, &harness::schema(), &clock, moved).await;
        let apply = oncebox_postgres::InboxHandler::new(inbox.clone(), nothing as Handler);
        let at = |offset| {
            Some(Position {
                stream: "orders".into(),
                partition: 0,
                offset,
            })
        };
        // Without a position: the watermark's statement is first sent by the settling below,
        // not prepared on a pooled connection before it (a prepared one is sent by name).
        let first = apply.apply(event("shop", "paid", 1), None).await;
        assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");

        proxy.set(Mode::Strand);
        let settle = apply.apply(event("shop", "paid", 2), at(2));
        let lost = tokio::time::timeout(HUNG, settle).await;
        let lost = lost.expect("the settling ends");
        assert!(
            matches!(
                lost,
                Err(ProcessError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{lost:?}"
        );
        assert_eq!(
            Stats::get(&proxy.stats.stranded),
            1,
            "the watermark was sent"
        );
        proxy.set(Mode::Pass);

        let again = apply.apply(event("shop", "paid", 2), at(2)).await;
        assert!(
            matches!(again, Err(ProcessError::Conflict { .. })),
            "{again:?}"
        );
        assert_eq!(apply.watermark("orders", 0).await.unwrap(), Some(2));
        all_closed(&proxy).await;
    });
}

/// A library handler's statements: oncebox's own around the handler (the savepoint before it,
/// the record's finish, the notify of its deliveries) waited for good on a silent connection,
/// holding the message in hand, and a NATS stream read in order behind it.
#[test]
fn a_handlers_savepoint_whose_connection_goes_silent_ends_and_the_retry_applies() {
    around_the_handler(b"SAVEPOINT oncebox_effect_", nothing);
}

#[test]
fn a_handlers_record_whose_connection_goes_silent_ends_and_the_retry_applies() {
    // The record's finish, which only the handler's path sends.
    around_the_handler(b"txid_current() = $5", nothing);
}

#[test]
fn a_handlers_notify_whose_connection_goes_silent_ends_and_the_retry_applies() {
    around_the_handler(b"pg_notify", queueing);
}

type Handler =
    for<'t> fn(
        &'t mut oncebox_postgres::Tx,
        &'t oncebox_core::Event,
    )
        -> futures::future::BoxFuture<'t, Result<Response, oncebox_postgres::HandlerError>>;

fn queueing<'t>(
    tx: &'t mut oncebox_postgres::Tx,
    event: &'t oncebox_core::Event,
) -> futures::future::BoxFuture<'t, Result<Response, oncebox_postgres::HandlerError>> {
    Box::pin(async move {
        let message = oncebox_core::OutboxMessage::json("email", event.key.to_string(), "{}");
        let _ = tx.enqueue(&message).await?;
        Ok(Response::completed("ok"))
    })
}

/// `handler` run through a proxy that strands the connection at the first bytes holding
/// `marker`: the call ends within `lost_after`, and once the connection was given up on (its
/// transaction with it) the retry applies the event.
fn around_the_handler(marker: &'static [u8], handler: Handler) {
    let Some(url) = harness::url() else {
        return;
    };
    run(async move {
        use oncebox_core::consume::Apply;
        let clock = ManualClock::new(EPOCH);
        let (proxy, inbox) = proxied(&url, &harness::schema(), &clock, marker).await;
        let apply = oncebox_postgres::InboxHandler::new(inbox.clone(), handler);

        proxy.set(Mode::Strand);
        let lost = tokio::time::timeout(HUNG, apply.apply(event("shop", "paid", 1), None)).await;
        let lost = lost.expect("the wait ends");
        assert!(
            matches!(lost, Err(ProcessError::Unavailable(_))),
            "{lost:?}"
        );
        assert_eq!(
            Stats::get(&proxy.stats.stranded),
            1,
            "the statement was sent"
        );
        proxy.set(Mode::Pass);
        all_closed(&proxy).await;
        let retried = tokio::time::timeout(HUNG, async {
            loop {
                match apply.apply(event("shop", "paid", 1), None).await {
                    Err(ProcessError::Unavailable(_)) => continue,
                    other => break other,
                }
            }
        })
        .await
        .expect("the key is free again");
        assert!(matches!(retried, Ok(Processed::Applied(_))), "{retried:?}");
    });
}
