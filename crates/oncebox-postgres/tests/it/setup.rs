//! Opening on databases as production sets them up: a schema a DBA created for an application
//! role that may not create schemas, a schema name with capitals, a server whose default
//! isolation is not PostgreSQL's default, and one that takes no writes. Each test runs on a
//! database of its own.

use oncebox_core::Processed;
use oncebox_core::store::{EventStore, Ingest};
use oncebox_postgres::sqlx::{self, Connection, PgConnection};
use oncebox_postgres::{Inbox, OpenError, Options};
use oncebox_testkit::{event, run};

use crate::database::OwnDatabase;

fn ingest(id: &str) -> Ingest {
    Ingest {
        event: event("shop", id, 1),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

async fn admin(db: &OwnDatabase) -> PgConnection {
    PgConnection::connect(&db.url).await.expect("connect")
}

/// Sets `setting` as the database's default for new sessions; the connection that did stays
/// open.
async fn database_default(db: &OwnDatabase, setting: &str) -> PgConnection {
    let mut admin = admin(db).await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut admin)
        .await
        .expect("name");
    sqlx::query(&format!("ALTER DATABASE {name} SET {setting}"))
        .execute(&mut admin)
        .await
        .expect("database default");
    admin
}

/// Tables of oncebox's in `schema`, by the exact name.
async fn tables_in(conn: &mut PgConnection, schema: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'oncebox_inbox'",
    )
    .bind(schema)
    .fetch_one(conn)
    .await
    .expect("tables")
}

#[test]
fn a_role_without_create_on_the_database_opens_the_schema_made_for_it() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let mut admin = admin(&db).await;
        let role = format!("oncebox_app_{}", uuid::Uuid::new_v4().simple());
        for sql in [
            format!("CREATE ROLE {role} LOGIN"),
            format!("CREATE SCHEMA app AUTHORIZATION {role}"),
        ] {
            sqlx::query(&sql).execute(&mut admin).await.expect(&sql);
        }
        let may_create: bool =
            sqlx::query_scalar("SELECT has_database_privilege($1, current_database(), 'CREATE')")
                .bind(&role)
                .fetch_one(&mut admin)
                .await
                .expect("privilege");
        assert!(!may_create, "the role may not create schemas");
        let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
        assert_ne!(url, db.url, "the URL names the role");
        let opened = Inbox::open(Options::new(url).schema("app")).await;
        let inbox = opened.expect("the schema exists: nothing to create");
        let out = inbox.ingest(ingest("evt-1")).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(tables_in(&mut admin, "app").await, 1);
        drop(inbox);
        for sql in [
            "DROP SCHEMA app CASCADE".to_owned(),
            format!("DROP ROLE {role}"),
        ] {
            sqlx::query(&sql).execute(&mut admin).await.expect(&sql);
        }
        drop(admin);
        db.drop().await;
    });
}

#[test]
fn a_schema_named_with_capitals_is_the_one_written_to() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let mut admin = admin(&db).await;
        // Its lowercase namesake exists too: the capitals must not be folded onto it.
        sqlx::query("CREATE SCHEMA tenant")
            .execute(&mut admin)
            .await
            .expect("schema");
        let inbox = Inbox::open(Options::new(db.url.clone()).schema("Tenant"))
            .await
            .expect("open");
        let out = inbox.ingest(ingest("evt-1")).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(tables_in(&mut admin, "Tenant").await, 1);
        assert_eq!(tables_in(&mut admin, "tenant").await, 0, "not its namesake");
        // A second node finds the schema and the record.
        let again = Inbox::open(Options::new(db.url.clone()).schema("Tenant"))
            .await
            .expect("open");
        let dup = again.ingest(ingest("evt-1")).await.expect("ingest");
        assert!(dup.is_duplicate(), "{dup:?}");
        // Spaces, a backslash and a quote survive the trip to the server too.
        let odd = r#"Two Words\ "x""#;
        let other = Inbox::open(Options::new(db.url.clone()).schema(odd))
            .await
            .expect("open");
        let out = other.ingest(ingest("evt-1")).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(tables_in(&mut admin, odd).await, 1);
        drop(other);
        drop((inbox, again, admin));
        db.drop().await;
    });
}

#[test]
fn transactions_are_read_committed_whatever_the_servers_default() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let admin = database_default(&db, "default_transaction_isolation = 'serializable'").await;
        let inbox = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("open");
        // Claims wait on a concurrent holder's row and then read its committed result: under
        // a stricter default each such wait would end in a serialization failure, `Busy`.
        let mut tx = inbox.pool().begin().await.expect("begin");
        let level: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(&mut *tx)
            .await
            .expect("isolation");
        assert_eq!(level, "read committed");
        drop((tx, inbox, admin));
        db.drop().await;
    });
}

/// A server that takes no writes (a standby the URL still names after a failover, or a role
/// whose transactions default to read-only) opens, on a boot it holds no anchor of too (the
/// open then writes none), and is not ready: every ingest there fails.
#[test]
fn a_server_that_takes_no_writes_is_not_ready() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let writable = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("open");
        writable.ready().await.expect("ready while it takes writes");
        // As after a reboot: no anchor for this boot.
        sqlx::query("DELETE FROM oncebox_purge_anchors")
            .execute(&mut admin(&db).await)
            .await
            .unwrap();
        let admin = database_default(&db, "default_transaction_read_only = on").await;
        let read_only = Inbox::open(Options::new(db.url.clone()).migrate(false))
            .await
            .expect("open on a current schema");
        let out = read_only.ingest(ingest("evt-ro")).await;
        assert!(out.is_err(), "an ingest there fails: {out:?}");
        let ready = read_only.ready().await;
        assert!(ready.is_err(), "{ready:?}");
        drop((writable, read_only, admin));
        db.drop().await;
    });
}

#[test]
fn every_key_column_compares_bytes_whatever_the_databases_collation() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let inbox = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("open");
        let mut admin = admin(&db).await;
        // Every text column of a unique or looked-up key.
        let keys = [
            ("oncebox_inbox", "source"),
            ("oncebox_inbox", "event_id"),
            ("oncebox_conflicts", "source"),
            ("oncebox_conflicts", "event_id"),
            ("oncebox_actions", "scope"),
            ("oncebox_actions", "key"),
            ("oncebox_versions", "entity"),
            ("oncebox_versions", "entity_id"),
            ("oncebox_offsets", "stream"),
            ("oncebox_outbox", "destination"),
            ("oncebox_outbox", "idempotency_key"),
            ("oncebox_outbox", "source"),
            ("oncebox_outbox", "event_id"),
        ];
        for (table, column) in keys {
            let collation: Option<String> = sqlx::query_scalar(
                "SELECT collation_name FROM information_schema.columns
                 WHERE table_name = $1 AND column_name = $2",
            )
            .bind(table)
            .bind(column)
            .fetch_one(&mut admin)
            .await
            .expect(table);
            assert_eq!(collation.as_deref(), Some("C"), "{table}.{column}");
        }
        // Still one record per key, and byte order in the listing: "B" (0x42) before "a".
        for id in ["a", "B", "a"] {
            inbox.ingest(ingest(id)).await.expect("ingest");
        }
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT event_id FROM oncebox_inbox ORDER BY event_id")
                .fetch_all(&mut admin)
                .await
                .expect("ids");
        assert_eq!(ids, ["B", "a"]);
        drop((inbox, admin));
        db.drop().await;
    });
}

/// Opened without migrations (operators' tools), a database with no schema, or an older one,
/// is refused and left exactly as it was: a newer tool must not migrate a database under the
/// nodes that keep it, nor create tables in a database it was pointed at by mistake. A newer
/// one opens only where its build marked it readable by this one.
#[test]
fn opened_without_migrations_a_missing_or_older_schema_is_refused_and_left_alone() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let mut admin = admin(&db).await;
        let as_is = || Inbox::open(Options::new(db.url.clone()).migrate(false));
        let none = as_is().await;
        assert!(
            matches!(none, Err(OpenError::SchemaOutdated { found: 0, .. })),
            "{none:?}"
        );
        assert_eq!(tables_in(&mut admin, "public").await, 0, "nothing created");
        let current = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("migrated");
        let known: i64 = sqlx::query_scalar("SELECT max(version) FROM oncebox_schema")
            .fetch_one(&mut admin)
            .await
            .expect("version");
        drop(current);
        // Current: opened as it is.
        as_is().await.expect("a current schema opens");
        // Older (as a database last opened by the previous version reads): refused, unchanged.
        sqlx::query("UPDATE oncebox_schema SET version = version - 1")
            .execute(&mut admin)
            .await
            .expect("older");
        let older = as_is().await;
        assert!(
            matches!(older, Err(OpenError::SchemaOutdated { found, known: k }) if found == known - 1 && k == known),
            "{older:?}"
        );
        let after: i64 = sqlx::query_scalar("SELECT max(version) FROM oncebox_schema")
            .fetch_one(&mut admin)
            .await
            .expect("version");
        assert_eq!(after, known - 1, "left as it was");

        // Newer, by a later build whose steps keep this build's statements valid (it marked
        // the schema readable from this version): opened and left at the later version, with
        // migrations or without. Marked readable from the later version only: refused.
        sqlx::query("UPDATE oncebox_schema SET version = $1")
            .bind(known + 1)
            .execute(&mut admin)
            .await
            .expect("newer");
        for migrate in [true, false] {
            let opened = Inbox::open(Options::new(db.url.clone()).migrate(migrate)).await;
            assert!(opened.is_ok(), "migrate {migrate}: {:?}", opened.err());
        }
        let after: i64 = sqlx::query_scalar("SELECT max(version) FROM oncebox_schema")
            .fetch_one(&mut admin)
            .await
            .expect("version");
        assert_eq!(after, known + 1, "left at the later version");
        sqlx::query("UPDATE oncebox_schema SET readable_from = $1")
            .bind(known + 1)
            .execute(&mut admin)
            .await
            .expect("breaking");
        let refused = as_is().await;
        assert!(
            matches!(refused, Err(OpenError::SchemaTooNew { found, known: k }) if found == known + 1 && k == known),
            "{refused:?}"
        );
        drop(admin);
        db.drop().await;
    });
}

/// A migration that must wait for an old node's long transaction on a table gives up within
/// the deadline, and the old node's work goes on: waiting, its request for the table would
/// have queued every other statement on that table behind it.
#[test]
fn a_migration_blocked_by_a_long_transaction_gives_up_and_blocks_nobody() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        drop(
            Inbox::open(Options::new(db.url.clone()))
                .await
                .expect("open"),
        );
        let mut first = admin(&db).await;
        // As a version before the key columns' collation left it: that migration, which
        // alters the tables, runs again (it and those after it change nothing twice).
        sqlx::query("UPDATE oncebox_schema SET version = 2")
            .execute(&mut first)
            .await
            .expect("older");
        // An old node's transaction, reading the inbox, left open.
        let mut old_node = admin(&db).await;
        sqlx::query("BEGIN")
            .execute(&mut old_node)
            .await
            .expect("begin");
        sqlx::query("SELECT count(*) FROM oncebox_inbox")
            .execute(&mut old_node)
            .await
            .expect("read");
        let opening = Inbox::open(
            Options::new(db.url.clone()).deadline(std::time::Duration::from_millis(500)),
        );
        let opened = tokio::time::timeout(std::time::Duration::from_secs(30), opening)
            .await
            .expect("the migration gave up instead of waiting");
        let Err(OpenError::Postgres(e)) = &opened else {
            panic!("refused on the lock: {opened:?}");
        };
        assert!(e.to_string().contains("lock timeout"), "{e}");
        // The old node goes on, and the migration runs once it is done.
        sqlx::query("SELECT count(*) FROM oncebox_inbox")
            .execute(&mut old_node)
            .await
            .expect("read");
        sqlx::query("COMMIT")
            .execute(&mut old_node)
            .await
            .expect("commit");
        Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("migrated");
        drop((first, old_node));
        db.drop().await;
    });
}
