//! Migrations over data an earlier version left: numeric ordering entities it kept in a
//! number's canonical text (`1e3`) are found under their plain decimal (`1000`) once this
//! version opens the database, as SQLite's step does (`schema/tests.rs` there).

use oncebox_core::ManualClock;
use oncebox_postgres::{Inbox, sqlx};
use oncebox_testkit::{EPOCH, run};

use crate::harness::{options, schema, url};

#[test]
fn numeric_entities_kept_in_a_numbers_canonical_text_are_rewritten_in_plain_decimal() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        let inbox = Inbox::open(options(&schema, &clock)).await.expect("open");
        let rows = [
            ("1e3", 5),
            ("1000", 3),
            ("12e2", 7),
            ("2e1", 1),
            ("20", 9),
            ("10e2", 1),
            ("abc", 1),
            ("7", 1),
        ];
        for (id, version) in rows {
            sqlx::query(
                "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
                 VALUES ('shop', $1, $2, 'shop', $1)",
            )
            .bind(id)
            .bind(version)
            .execute(inbox.pool())
            .await
            .expect("version row");
        }
        // A library handler's own entity (`Tx::advance("order", ..)`), left as it is.
        sqlx::query(
            "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
             VALUES ('order', '5e3', 4, 'shop', 'x')",
        )
        .execute(inbox.pool())
        .await
        .expect("library row");
        let expected = [
            ("1000", 5),
            ("10e2", 1),
            ("1200", 7),
            ("20", 9),
            ("5e3", 4),
            ("7", 1),
            ("abc", 1),
        ]
        .map(|(id, v)| (id.to_owned(), v));
        let mut inbox = inbox;
        // Twice: the step run again over what it changed changes nothing.
        for _ in 0..2 {
            sqlx::query("UPDATE oncebox_schema SET version = version - 1")
                .execute(inbox.pool())
                .await
                .expect("older");
            drop(inbox);
            inbox = Inbox::open(options(&schema, &clock))
                .await
                .expect("migrated");
            let found: Vec<(String, i64)> = sqlx::query_as(
                "SELECT entity_id, version FROM oncebox_versions ORDER BY entity_id COLLATE \"C\"",
            )
            .fetch_all(inbox.pool())
            .await
            .expect("versions");
            assert_eq!(found, expected);
        }
    });
}
