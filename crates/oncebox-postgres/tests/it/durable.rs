//! G6 at the very commit that keeps an event: `synchronous_commit` is `on` when the inbox's
//! transaction commits, whatever the database's default, and after a handler that set it off
//! for its own transaction. Watched by a deferred constraint trigger, which runs inside the
//! `COMMIT` and notes the setting there; the tests elsewhere look at the session before or
//! after, never at the commit itself.

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Processed, Response};
use oncebox_postgres::sqlx::{self, Connection, PgConnection};
use oncebox_postgres::{Inbox, Options};
use oncebox_testkit::{event, run};

use crate::database::OwnDatabase;

/// What the trigger notes at each commit that wrote an inbox row.
const WATCH: &str = "
CREATE TABLE commit_durability (event_id TEXT NOT NULL, setting TEXT NOT NULL);
CREATE FUNCTION note_durability() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO commit_durability VALUES (NEW.event_id, current_setting('synchronous_commit'));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER note_durability AFTER INSERT OR UPDATE ON oncebox_inbox
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note_durability();";

#[test]
fn the_inbox_commits_synchronously_whatever_the_default_or_the_handler_set() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let mut admin = PgConnection::connect(&db.url).await.expect("connect");
        let name: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut admin)
            .await
            .expect("name");
        sqlx::query(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .execute(&mut admin)
        .await
        .expect("database default");
        let inbox = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("open");
        sqlx::raw_sql(WATCH)
            .execute(&mut admin)
            .await
            .expect("watch commits");
        // The fault is in place: a session of this database commits lazily unless told not to.
        let default: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut PgConnection::connect(&db.url).await.expect("connect"))
            .await
            .expect("show");
        assert_eq!(default, "off");
        let ingested = inbox
            .ingest(Ingest {
                event: event("shop", "evt-batch", 1),
                order: None,
                accepted: b"accepted".to_vec(),
                stale: Vec::new(),
                routes: Vec::new(),
            })
            .await;
        assert!(
            matches!(ingested, Ok(Processed::Applied(_))),
            "{ingested:?}"
        );
        let processed = inbox
            .process(event("shop", "evt-handler", 1), |tx| {
                Box::pin(async move {
                    sqlx::Executor::execute(tx.conn(), "SET LOCAL synchronous_commit = off")
                        .await?;
                    Ok(Response::completed("ok"))
                })
            })
            .await;
        assert!(
            matches!(processed, Ok(Processed::Applied(_))),
            "{processed:?}"
        );
        let noted: Vec<(String, String)> = sqlx::query_as(
            "SELECT event_id, setting FROM commit_durability ORDER BY event_id, setting",
        )
        .fetch_all(&mut admin)
        .await
        .expect("noted");
        let events: Vec<&str> = noted.iter().map(|(e, _)| e.as_str()).collect();
        assert!(
            events.contains(&"evt-batch") && events.contains(&"evt-handler"),
            "both commits watched: {noted:?}"
        );
        assert!(
            noted.iter().all(|(_, setting)| setting == "on"),
            "a commit that kept an event was lazy: {noted:?}"
        );
        drop((inbox, admin));
        db.drop().await;
    });
}
