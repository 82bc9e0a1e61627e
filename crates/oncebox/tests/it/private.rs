//! What the gateway keeps to itself: a store's own error text (tables, schemas, hosts) reaches
//! the log, never the body of a 503 a webhook sender shows in its dashboard.

use std::time::Duration;

use oncebox_postgres::sqlx;

use crate::nodes::{gateway, run_within};
use crate::schema::Schema;

#[test]
fn a_storage_error_is_logged_and_the_client_is_told_only_its_kind() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    run_within(Duration::from_secs(60), async move {
        let schema = Schema::create(&base, "oncebox_private").await;
        let dir = tempfile::tempdir().unwrap();
        let config = "listen = \"127.0.0.1:0\"\n[sources.open]\nsignature = \"none\"\n";
        std::fs::write(dir.path().join("oncebox.toml"), config).unwrap();
        let node = gateway(dir.path(), &schema.url, &["--no-relay"]);
        let client = reqwest::Client::new();
        let post = |id: &str| {
            client
                .post(format!("{}/v1/sources/open/events", node.url))
                .header("content-type", "application/json")
                .body(format!(r#"{{"id":"{id}"}}"#))
                .send()
        };
        assert_eq!(post("evt_1").await.unwrap().status(), 202);
        // The storage fails under the gateway: its inbox table is gone.
        let pool = schema.pool().await;
        let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
        sqlx::query(&rename("oncebox_inbox", "oncebox_inbox_away"))
            .execute(&pool)
            .await
            .unwrap();
        let refused = post("evt_2").await.unwrap();
        assert_eq!(refused.status(), 503);
        assert!(refused.headers().contains_key("retry-after"));
        let body = refused.text().await.unwrap();
        assert!(body.contains("the storage failed"), "{body}");
        assert!(
            !body.contains("oncebox_inbox") && !body.contains("oncebox_private"),
            "the store's own text reached the client: {body}"
        );
        // The operator reads it in the log.
        let log = std::fs::read_to_string(dir.path().join("gateway-0.log")).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("event not stored") && l.contains("oncebox_inbox")),
            "{log}"
        );
        // Nothing was lost: the storage back, the retry is the event's first acceptance.
        sqlx::query(&rename("oncebox_inbox_away", "oncebox_inbox"))
            .execute(&pool)
            .await
            .unwrap();
        let again = post("evt_2").await.unwrap();
        assert_eq!(again.status(), 202);
        assert!(!again.headers().contains_key("idempotent-replayed"));
        node.stop();
    });
}
