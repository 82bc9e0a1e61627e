//! A lease's write outside a transaction, or a library handler's `COMMIT`, whose answer is
//! lost after the server committed it: the caller is told the outcome is unknown
//! (`CommitUnknown`), not that nothing was kept, and its retry reads what happened (a handler
//! is not run again); so is an operator's `resolve`; the relay, whose record's answer is lost, takes the guard
//! refusing its retry for its own write done, not for a lost lease.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, Resolve};
use oncebox_core::store::EventStore;
use oncebox_core::{Begun, LeaseError, ManualClock, Response, SystemClock, Unavailable};
use oncebox_postgres::{Inbox, Options, Resolution};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::{EPOCH, event, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::claims::routed;
use crate::harness::{schema, url};
use crate::proxy;

/// When to cut: after the client sent a statement holding `sent`, the server's answer holding
/// `answered` is swallowed and both connections closed.
#[derive(Default)]
struct Cut {
    at: Mutex<Option<(&'static [u8], &'static [u8])>>,
    /// The cut happened: an answer holding `answered` was read from the server and dropped.
    done: AtomicBool,
    /// Sent to the client in the dropped answer's place before the cut, as a pooler in between
    /// answers when its server connection breaks.
    instead: Mutex<Option<Vec<u8>>>,
}

/// A stand-in between oncebox and the server that passes everything through but the one
/// answer `cut` names.
async fn cutting(server: String, cut: Arc<Cut>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (server, cut) = (server.clone(), cut.clone());
            tokio::spawn(async move {
                let Some(startup) = proxy::startup(&mut client, false).await else {
                    return;
                };
                let Ok(mut upstream) = TcpStream::connect(&server).await else {
                    return;
                };
                if upstream.write_all(&startup).await.is_err() {
                    return;
                }
                pump(client, upstream, cut).await;
            });
        }
    });
    addr.to_string()
}

/// Copies both ways until either side closes or the cut is made.
async fn pump(client: TcpStream, upstream: TcpStream, cut: Arc<Cut>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = upstream.into_split();
    let armed = Arc::new(AtomicBool::new(false));
    let sent = {
        let (cut, armed) = (cut.clone(), armed.clone());
        async move {
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                let at = *cut.at.lock().unwrap();
                if at.is_some_and(|(sent, _)| holds(&buf[..n], sent)) {
                    armed.store(true, Ordering::SeqCst);
                }
                if to_server.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let answered = async move {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf).await {
            let at = *cut.at.lock().unwrap();
            if armed.load(Ordering::SeqCst)
                && at.is_some_and(|(_, answered)| holds(&buf[..n], answered))
            {
                *cut.at.lock().unwrap() = None;
                let instead = cut.instead.lock().unwrap().take();
                if let Some(instead) = instead {
                    let _ = to_client.write_all(&instead).await;
                }
                cut.done.store(true, Ordering::SeqCst);
                return;
            }
            if to_client.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever ends first ends both: the halves are dropped, closing the client's socket.
    tokio::select! {
        () = sent => {}
        () = answered => {}
    }
}

/// A fresh schema opened twice: through a [`cutting`] stand-in, whose cut is set through the
/// returned [`Cut`], and directly, to read what happened past the stand-in.
async fn stores(base: &str, clock: Option<&ManualClock>) -> (Arc<Cut>, Inbox, Inbox) {
    let cut = Arc::new(Cut::default());
    let proxied = proxy::via(base, &cutting(proxy::server(base), cut.clone()).await);
    let schema = schema();
    let on_clock = |o: Options| match clock {
        Some(clock) => o.clock(Arc::new(clock.clone())),
        None => o,
    };
    let inbox = Inbox::open(on_clock(Options::new(proxied).schema(&schema)))
        .await
        .expect("open through the stand-in");
    let direct = Inbox::open(on_clock(Options::new(base).schema(&schema)))
        .await
        .expect("open");
    (cut, inbox, direct)
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_lease_write_whose_answer_is_lost_after_its_commit_is_commit_unknown() {
    run(async {
        let Some(base) = url() else { return };
        let clock = ManualClock::new(EPOCH);
        let (cut, inbox, direct) = stores(&base, Some(&clock)).await;
        let lease_of = |id: &'static str| {
            let inbox = inbox.clone();
            async move {
                match inbox
                    .begin(event("psp", id, 1), std::time::Duration::from_secs(60))
                    .await
                {
                    Ok(Begun::Leased(lease)) => lease,
                    other => panic!("{id}: {other:?}"),
                }
            }
        };

        // `release`: the key was freed, but its holder never heard so.
        let lease = lease_of("charge-1").await;
        *cut.at.lock().unwrap() = Some((b"DELETE FROM oncebox_inbox", b"DELETE 1"));
        let released = inbox.release(&lease).await;
        assert!(cut.done.swap(false, Ordering::SeqCst), "the answer was cut");
        assert!(
            matches!(
                released,
                Err(LeaseError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{released:?}"
        );
        let record = direct.record(&lease.key).await.unwrap();
        assert!(record.is_none(), "the release committed: {record:?}");

        // `complete`: done, unheard; the holder's retry is told `Ok`.
        let lease = lease_of("charge-2").await;
        *cut.at.lock().unwrap() = Some((b"UPDATE oncebox_inbox SET state = $4", b"UPDATE 1"));
        let completed = inbox.complete(&lease, Response::completed("paid")).await;
        assert!(cut.done.swap(false, Ordering::SeqCst), "the answer was cut");
        assert!(
            matches!(
                completed,
                Err(LeaseError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{completed:?}"
        );
        let again = inbox.complete(&lease, Response::completed("paid")).await;
        assert!(again.is_ok(), "{again:?}");
    });
}

/// The relay's record of a delivered attempt commits and its answer is lost. The relay tries
/// again within its lease; the lease's guard refuses the retry, since the first try took
/// effect. That used to be counted and logged as a lost lease ("outcome not recorded").
#[test]
fn a_relay_record_whose_answer_is_lost_is_its_own_write_not_a_lost_lease() {
    run(async {
        let Some(base) = url() else { return };
        let (cut, inbox, direct) = stores(&base, None).await;
        let ingested = EventStore::ingest(&inbox, routed("evt-r", &["hooks"])).await;
        assert!(ingested.is_ok(), "{ingested:?}");
        let (hook, seen) = crate::relay::receiver().await;
        let relay = Relay::new(
            inbox.clone(),
            vec![crate::relay::route(hook)],
            Arc::new(SystemClock),
            RelayOptions::default(),
        );
        *cut.at.lock().unwrap() = Some((b"WITH verdict AS", b"INSERT 0 1"));
        let out = relay.run_once().await.unwrap();
        assert!(cut.done.load(Ordering::SeqCst), "the answer was cut");
        assert_eq!((out.delivered, out.fenced), (1, 0), "{out:?}");
        assert_eq!(seen.borrow().len(), 1, "sent once");
        let filter = DeliveryFilter {
            limit: 10,
            ..DeliveryFilter::default()
        };
        let page = direct.deliveries(filter).await.unwrap();
        let states: Vec<_> = page.items.iter().map(|d| (d.state, d.attempts)).collect();
        assert_eq!(states, vec![(DeliveryState::Delivered, 1)]);
    });
}

/// An operator settles an uncertain key and a delivery; both writes commit and their answers
/// are lost. "The storage failed" would say nothing was kept, and the retry then reads "not
/// resolvable" for the operator's own write.
#[test]
fn a_resolve_whose_answer_is_lost_after_its_commit_is_commit_unknown() {
    run(async {
        let Some(base) = url() else { return };
        let (cut, inbox, direct) = stores(&base, None).await;

        let lease = match inbox
            .begin(
                event("psp", "parked", 1),
                std::time::Duration::from_secs(60),
            )
            .await
        {
            Ok(Begun::Leased(lease)) => lease,
            other => panic!("{other:?}"),
        };
        inbox.uncertain(&lease).await.expect("parked");
        *cut.at.lock().unwrap() = Some((b"AND state = 'uncertain'", b"DELETE 1"));
        let resolved = inbox.resolve(&lease.key, Resolution::Released).await;
        assert!(cut.done.swap(false, Ordering::SeqCst), "the answer was cut");
        assert!(
            matches!(
                resolved,
                Err(oncebox_postgres::Error::Unavailable(
                    Unavailable::CommitUnknown(_)
                ))
            ),
            "{resolved:?}"
        );
        let record = direct.record(&lease.key).await.unwrap();
        assert!(record.is_none(), "the resolve committed: {record:?}");

        let ingested = EventStore::ingest(&inbox, routed("evt-d", &["hooks"])).await;
        assert!(ingested.is_ok(), "{ingested:?}");
        let filter = DeliveryFilter {
            limit: 10,
            ..DeliveryFilter::default()
        };
        let id = direct.deliveries(filter.clone()).await.unwrap().items[0].id;
        *cut.at.lock().unwrap() = Some((b"UPDATE oncebox_outbox SET state = $2", b"UPDATE 1"));
        let now = oncebox_core::Clock::now(&SystemClock);
        let resolved = DeliveryStore::resolve(&inbox, id, Resolve::Dead, "by hand", now).await;
        assert!(cut.done.swap(false, Ordering::SeqCst), "the answer was cut");
        assert!(
            matches!(resolved, Err(Unavailable::CommitUnknown(_))),
            "{resolved:?}"
        );
        let page = direct.deliveries(filter).await.unwrap();
        assert_eq!(
            page.items[0].state,
            DeliveryState::Dead,
            "the resolve committed"
        );
    });
}

/// PgBouncer's answer when its server connection broke under a query: an `ErrorResponse` with
/// SQLSTATE `08P01` ("server conn crashed?"), then the connection closed.
fn pooler_crashed() -> Vec<u8> {
    let mut fields = Vec::new();
    for (kind, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "08P01")] {
        fields.push(kind);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.extend_from_slice(b"Mserver conn crashed?\0\0");
    let mut message = vec![b'E'];
    message.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap().to_be_bytes());
    message.extend_from_slice(&fields);
    message
}

/// A handler's `COMMIT` that the server did, answered by a pooler in between with `08P01`: the
/// outcome is unknown, not "nothing kept" (which a connection exception was read as), and the
/// event is there.
#[test]
fn a_commit_answered_by_a_poolers_connection_exception_is_commit_unknown() {
    run(async {
        let Some(base) = url() else { return };
        let (cut, inbox, direct) = stores(&base, None).await;
        *cut.instead.lock().unwrap() = Some(pooler_crashed());
        // The client's `COMMIT` query and the server's `COMMIT` command tag, as framed: the
        // transaction's `BEGIN … READ COMMITTED` holds the word too.
        let (sent, answered): (&[u8], &[u8]) = (b"Q\0\0\0\x0bCOMMIT\0", b"C\0\0\0\x0bCOMMIT\0");
        *cut.at.lock().unwrap() = Some((sent, answered));
        let e = event("shop", "pooled", 1);
        let out = inbox
            .process(e.clone(), |_tx| {
                Box::pin(async { Ok(Response::completed("applied")) })
            })
            .await;
        assert!(cut.done.load(Ordering::SeqCst), "the answer was replaced");
        assert!(
            matches!(
                out,
                Err(oncebox_core::ProcessError::Unavailable(
                    Unavailable::CommitUnknown(_)
                ))
            ),
            "{out:?}"
        );
        let record = direct.record(&e.key).await.unwrap();
        assert!(record.is_some(), "the server committed it");
    });
}

/// A library handler's `COMMIT` whose answer is lost after the server committed it: the
/// caller is told the outcome is unknown, and its retry (a sender's, a broker's redelivery)
/// is answered from the record, the first response replayed, its handler not run again.
#[test]
fn a_handlers_commit_whose_answer_is_lost_is_unknown_and_its_retry_a_duplicate() {
    run(async {
        let Some(base) = url() else { return };
        let (cut, inbox, direct) = stores(&base, None).await;
        let (sent, answered): (&[u8], &[u8]) = (b"Q\0\0\0\x0bCOMMIT\0", b"C\0\0\0\x0bCOMMIT\0");
        *cut.at.lock().unwrap() = Some((sent, answered));
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let e = event("shop", "charge", 1);
        let counted = runs.clone();
        let out = inbox
            .process(e.clone(), move |_tx| {
                counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(Response::completed("charged")) })
            })
            .await;
        assert!(
            cut.done.load(Ordering::SeqCst),
            "the server's answer was lost"
        );
        assert!(
            matches!(
                out,
                Err(oncebox_core::ProcessError::Unavailable(
                    Unavailable::CommitUnknown(_)
                ))
            ),
            "{out:?}"
        );
        let record = direct.record(&e.key).await.unwrap();
        assert!(record.is_some(), "the server committed it");

        let counted = runs.clone();
        let again = inbox
            .process(e, move |_tx| {
                counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(Response::completed("charged again")) })
            })
            .await;
        assert!(
            matches!(&again, Ok(oncebox_core::Processed::Duplicate(r)) if r.body == b"charged"),
            "{again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    });
}
