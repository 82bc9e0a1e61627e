//! The schema oncebox's statements reach, whatever the session's path says: a handler that
//! points `search_path` at another deployment's schema (for its transaction or its whole
//! session) changes nothing there; a path naming no schema, and a pooler that drops the
//! connection's startup options (schema and settings with them), are refused at open.

use std::time::Duration;

use oncebox_core::{Begun, Key, ManualClock, OutboxMessage, Processed, RecordState, Response};
use oncebox_postgres::sqlx::{self, PgPool};
use oncebox_postgres::{Inbox, OpenError, Options};
use oncebox_testkit::{event, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{Postgres, options, schema, url};

/// Rows in each of the tables a handler's calls write, in `schema`.
async fn written(pool: &PgPool, schema: &str) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in ["oncebox_actions", "oncebox_versions", "oncebox_outbox"] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".{table}"))
            .fetch_one(pool)
            .await
            .expect("count");
        counts.push(n);
    }
    counts
}

/// Deployment B parks a payment uncertain; deployment A's handler then points its path at B
/// (for the transaction, then for the session) and takes an action key, an entity version and
/// an outbox row. Before, A's finish marked B's record (same row id) completed with A's answer,
/// and B then answered a charge nobody confirmed as a duplicate.
#[test]
fn a_handler_pointing_search_path_elsewhere_touches_only_its_own_schema() {
    run(async {
        let Some(_) = url() else { return };
        let clock = ManualClock::new(oncebox_testkit::EPOCH);
        let b = Postgres::open(schema(), clock.clone()).await;
        let payment = event("psp", "charge-1", 1);
        let Begun::Leased(lease) = b
            .inbox
            .begin(payment.clone(), Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("a lease on a fresh key");
        };
        b.inbox.uncertain(&lease).await.unwrap();

        // One connection, so the session the handler changed is the one read from after.
        let a_schema = schema();
        let a = Inbox::open(options(&a_schema, &clock).max_connections(1))
            .await
            .unwrap();
        for (n, set) in ["SET LOCAL search_path TO", "SET search_path TO"]
            .iter()
            .enumerate()
        {
            let other = format!("{set} \"{}\"", b.schema);
            let answer = a
                .process(event("shop", &format!("o{n}"), 1), move |tx| {
                    Box::pin(async move {
                        sqlx::query(&other).execute(tx.conn()).await?;
                        tx.once("receipt", &format!("o{n}")).await?;
                        tx.advance("order", &format!("o{n}"), 1).await?;
                        tx.enqueue(&OutboxMessage::json("email", format!("o{n}"), "{}"))
                            .await?;
                        Ok(Response::completed("A's answer"))
                    })
                })
                .await
                .unwrap();
            assert_eq!(
                answer,
                Processed::Applied(Response::completed("A's answer")),
                "{set}"
            );
            let own = a
                .record(&Key::parse("shop", &format!("o{n}")).unwrap())
                .await
                .unwrap();
            assert!(
                matches!(own.map(|r| r.state), Some(RecordState::Done(_))),
                "{set}: A's own record finished, read back on the same connection"
            );
        }
        let path: String = sqlx::query_scalar("SELECT current_setting('search_path')")
            .fetch_one(a.pool())
            .await
            .unwrap();
        assert_eq!(
            path,
            format!("\"{a_schema}\""),
            "the session's own path, reset"
        );
        assert_eq!(written(a.pool(), &a_schema).await, vec![2, 2, 2]);
        assert_eq!(written(b.inbox.pool(), &b.schema).await, vec![0, 0, 0]);
        let theirs = b.inbox.record(&payment.key).await.unwrap().unwrap();
        assert!(
            matches!(theirs.state, RecordState::Uncertain),
            "{:?}",
            theirs.state
        );
    });
}

#[test]
fn a_search_path_naming_no_schema_is_refused_at_open() {
    run(async {
        let Some(base) = url() else { return };
        let separator = if base.contains('?') { '&' } else { '?' };
        let nowhere = format!("{base}{separator}options=-c%20search_path%3Dno_such_schema_here");
        let opened = Inbox::open(Options::new(nowhere)).await;
        assert!(
            matches!(&opened, Err(OpenError::NoSchema { search_path }) if search_path == "no_such_schema_here"),
            "{opened:?}"
        );
    });
}

/// A stand-in for a pooler that ignores startup options (PgBouncer's
/// `ignore_startup_parameters = options`): it refuses TLS, drops `options` from the startup
/// message and then passes everything through.
async fn dropping_options(server: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let server = server.clone();
            tokio::spawn(async move {
                let Some(startup) = startup_without_options(&mut client).await else {
                    return;
                };
                let Ok(mut upstream) = TcpStream::connect(&server).await else {
                    return;
                };
                if upstream.write_all(&startup).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    addr.to_string()
}

/// Reads the client's startup message (answering `N` to a TLS request first) and returns it
/// with its `options` parameter left out.
async fn startup_without_options(client: &mut TcpStream) -> Option<Vec<u8>> {
    loop {
        let len = usize::try_from(client.read_u32().await.ok()?).ok()?;
        let mut body = vec![0; len.checked_sub(4)?];
        client.read_exact(&mut body).await.ok()?;
        if body.get(..4) == Some(&80_877_103u32.to_be_bytes()[..]) {
            client.write_all(b"N").await.ok()?;
            continue;
        }
        let mut kept = body[..4].to_vec();
        let mut fields = body[4..].split(|b| *b == 0);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if name.is_empty() || name == b"options" {
                continue;
            }
            for part in [name, value] {
                kept.extend_from_slice(part);
                kept.push(0);
            }
        }
        kept.push(0);
        let mut message = u32::try_from(kept.len() + 4).ok()?.to_be_bytes().to_vec();
        message.extend_from_slice(&kept);
        return Some(message);
    }
}

/// `base` with its server replaced by a [`dropping_options`] proxy in front of it.
async fn via_dropping_proxy(base: &str) -> String {
    let (scheme, rest) = base.split_once("://").unwrap();
    let (auth, hostpath) = rest.rsplit_once('@').unwrap_or(("", rest));
    let host_end = hostpath.find('/').unwrap_or(hostpath.len());
    let proxy = dropping_options(hostpath[..host_end].to_owned()).await;
    let at = if auth.is_empty() { "" } else { "@" };
    format!("{scheme}://{auth}{at}{proxy}{}", &hostpath[host_end..])
}

/// Through a pooler that drops startup options, a schema asked for (by `Options::schema` or
/// in the URL's `options`) is refused: two deployments would share the pooler's default one.
/// Asked for nowhere (the role's own `search_path` names it, as behind PgBouncer), the open
/// goes on, and events are processed.
#[test]
fn a_pooler_that_drops_startup_options_is_refused_where_they_named_the_schema() {
    run(async {
        let Some(base) = url() else { return };
        let via = via_dropping_proxy(&base).await;
        let opened = Inbox::open(Options::new(via.clone()).schema(schema())).await;
        assert!(
            matches!(opened, Err(OpenError::StartupOptionsIgnored)),
            "{opened:?}"
        );
        let separator = if via.contains('?') { '&' } else { '?' };
        let in_url = format!("{via}{separator}options=-c%20search_path%3Dsome_schema");
        let opened = Inbox::open(Options::new(in_url)).await;
        assert!(
            matches!(opened, Err(OpenError::StartupOptionsIgnored)),
            "{opened:?}"
        );

        let Some(db) = crate::database::OwnDatabase::create().await else {
            return;
        };
        let inbox = Inbox::open(Options::new(via_dropping_proxy(&db.url).await))
            .await
            .expect("opened on the role's own path");
        let answer = inbox
            .process(event("shop", "through-a-pooler", 1), |_| {
                Box::pin(async { Ok(Response::completed("ok")) })
            })
            .await;
        assert_eq!(
            answer.unwrap(),
            Processed::Applied(Response::completed("ok"))
        );
        drop(inbox);
        db.drop().await;
    });
}
