//! The schema oncebox's statements reach, whatever the session's path says: a handler that
//! points `search_path` at another deployment's schema (for its transaction or its whole
//! session) changes nothing there; a path naming no schema, and a pooler that drops the
//! connection's startup options (schema and settings with them), and tables found behind the
//! path's first schema, are refused at open; behind
//! such a pooler a database whose default isolation is REPEATABLE READ still migrates once
//! when two nodes start together.

use std::time::Duration;

use oncebox_core::{Begun, Key, ManualClock, OutboxMessage, Processed, RecordState, Response};
use oncebox_postgres::sqlx::{self, Connection, PgPool};
use oncebox_postgres::{Inbox, OpenError, Options};
use oncebox_testkit::{event, run};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{Postgres, options, schema, session_setting, url};
use crate::proxy;

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

        let a_schema = schema();
        let a = Inbox::open(options(&a_schema, &clock).max_connections(2))
            .await
            .unwrap();
        for (n, set) in ["SET LOCAL search_path TO", "SET search_path TO"]
            .iter()
            .enumerate()
        {
            let other = format!("{set} \"{}\"", b.schema);
            let (pid_tx, pid) = tokio::sync::oneshot::channel::<i32>();
            let answer = a
                .process(event("shop", &format!("o{n}"), 1), move |tx| {
                    Box::pin(async move {
                        sqlx::query(&other).execute(tx.conn()).await?;
                        let pid = sqlx::query_scalar("SELECT pg_backend_pid()");
                        let _ = pid_tx.send(pid.fetch_one(tx.conn()).await?);
                        tx.once("receipt", &format!("o{n}")).await?;
                        tx.advance("order", &format!("o{n}"), 1).await?;
                        let _ = tx
                            .enqueue(&OutboxMessage::json("email", format!("o{n}"), "{}"))
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
                "{set}: A's own record finished"
            );
            let path = session_setting(a.pool(), pid.await.unwrap(), "search_path").await;
            assert_eq!(
                path,
                format!("\"{a_schema}\""),
                "{set}: the session's own path, reset"
            );
        }
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

/// Tables kept in a schema of the path behind one that did not exist then. Once that one is
/// created (a schema named like the role, before `public` in the default `"$user", public`),
/// unqualified names still find the tables behind it while oncebox's own statements and any
/// new table go to it: the handlers' statements failed, or a migration would have started
/// empty tables there, every key kept forgotten. Refused at open, naming both.
#[test]
fn tables_found_behind_the_current_schema_are_refused_at_open() {
    run(async {
        let Some(base) = url() else { return };
        let (first, kept) = (schema(), schema());
        let clock = ManualClock::new(oncebox_testkit::EPOCH);
        let made = Inbox::open(options(&kept, &clock))
            .await
            .expect("tables made");
        drop(made);
        let separator = if base.contains('?') { '&' } else { '?' };
        let path = format!("{base}{separator}options=-c%20search_path%3D{first}%2C{kept}");
        // While `first` does not exist, the path reaches `kept` first.
        let before = Inbox::open(Options::new(path.clone())).await;
        assert!(before.is_ok(), "{before:?}");
        drop(before);
        let admin = PgPool::connect(&base).await.unwrap();
        sqlx::query(&format!("CREATE SCHEMA \"{first}\""))
            .execute(&admin)
            .await
            .unwrap();
        let after = Inbox::open(Options::new(path)).await;
        assert!(
            matches!(&after, Err(OpenError::SchemaElsewhere { tables, current })
                if *tables == kept && *current == first),
            "{after:?}"
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
                let Some(startup) = proxy::startup(&mut client, true).await else {
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

/// `base` with its server replaced by a [`dropping_options`] proxy in front of it.
async fn via_dropping_proxy(base: &str) -> String {
    let proxy = dropping_options(proxy::server(base)).await;
    proxy::via(base, &proxy)
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

/// Two nodes starting together behind a pooler that drops startup options, on a database whose
/// default isolation is REPEATABLE READ: both wait on the migration lock a third session holds,
/// then one migrates and the other must see it done. Its migration transaction took its
/// snapshot while waiting, so under the database's default it ran the migration again and
/// failed its start (42P07).
#[test]
fn nodes_starting_together_migrate_once_whatever_the_default_isolation() {
    run(async {
        let Some(db) = crate::database::OwnDatabase::create().await else {
            return;
        };
        let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::Executor::execute(
            &mut admin,
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = \
             %L', current_database(), 'repeatable read'); END $$",
        )
        .await
        .unwrap();
        let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let mut held = holder.begin().await.unwrap();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext('oncebox-migrate:' || current_schema()))",
        )
        .execute(&mut *held)
        .await
        .unwrap();
        let via = via_dropping_proxy(&db.url).await;
        let nodes: Vec<_> = (0..2)
            .map(|_| tokio::spawn(Inbox::open(Options::new(via.clone()))))
            .collect();
        // Both in their migration transaction, waiting on the lock.
        let mut waiting = 0_i64;
        for _ in 0..1_000 {
            waiting = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_one(&mut admin)
            .await
            .unwrap();
            if waiting == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(waiting, 2, "both nodes wait on the migration lock");
        let isolation: String = sqlx::query_scalar(
            "SELECT setting FROM pg_settings WHERE name = 'default_transaction_isolation'",
        )
        .fetch_one(&mut *held)
        .await
        .unwrap();
        assert_eq!(isolation, "repeatable read", "the database's default");
        held.commit().await.unwrap();
        for node in nodes {
            let opened = node.await.unwrap();
            assert!(opened.is_ok(), "{opened:?}");
        }
        drop((holder, admin));
        db.drop().await;
    });
}
