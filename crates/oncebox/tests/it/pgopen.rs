//! Opening PostgreSQL from the command line: TLS as `sslmode` asks, a refused or unverified
//! TLS connection as a setting to fix (exit 2), and each cause of a failure said once.

use std::time::Duration;

use oncebox_postgres::sqlx::{self, Connection, PgConnection};

use crate::nodes::run_within;
use crate::schema::Schema;
use crate::support::{oncebox, text};

/// `sslmode=require` gets the server's own answer: a TLS connection where it offers TLS, its
/// refusal (exit 2) where it does not; never "built without TLS support" (exit 4). Where it
/// offers TLS, `verify-full` checks the certificate: this server's names no IP address, so
/// the certificate is refused by name, which only a real handshake can tell.
#[test]
fn sslmode_is_honoured_and_tls_refusals_are_exit_2() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    run_within(Duration::from_secs(60), async move {
        let schema = Schema::create(&base, "tls").await;
        let mut plain = PgConnection::connect(&base).await.unwrap();
        let ssl: String = sqlx::query_scalar("SHOW ssl")
            .fetch_one(&mut plain)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_owned();
        let run = move |url: String| {
            let d = d.clone();
            async move {
                tokio::task::spawn_blocking(move || oncebox(&d, &["--database", &url, "migrate"]))
                    .await
                    .unwrap()
            }
        };
        let required = run(format!("{}&sslmode=require", schema.url)).await;
        let said = text(&required);
        assert!(!said.contains("without TLS"), "{said}");
        if ssl == "on" {
            assert_eq!(required.status.code(), Some(0), "{said}");
            let host = base.replace("@localhost", "@127.0.0.1");
            let separator = if host.contains('?') { '&' } else { '?' };
            let verified = run(format!("{host}{separator}sslmode=verify-full")).await;
            let said = text(&verified);
            assert_eq!(verified.status.code(), Some(2), "{said}");
            assert!(said.contains("certificate"), "{said}");
        } else {
            assert_eq!(required.status.code(), Some(2), "{said}");
            assert!(said.contains("does not support TLS"), "{said}");
        }
        // A root certificate file that is not there is named.
        let missing = run(format!(
            "{}&sslmode=verify-full&sslrootcert=/nonexistent/root.pem",
            schema.url
        ))
        .await;
        let said = text(&missing);
        assert_eq!(missing.status.code(), Some(2), "{said}");
        assert!(said.contains("sslrootcert /nonexistent/root.pem"), "{said}");
    });
}

/// A refused login is said once: the driver's error quotes the server's, which it also gives
/// as its cause, and every link was printed ("role … does not exist" three times).
#[test]
fn a_postgres_open_error_says_each_cause_once() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (scheme, rest) = base.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    let url = format!("{scheme}://no_such_role_here@{host}");
    let out = oncebox(dir.path(), &["--database", &url, "migrate"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert_eq!(said.matches("does not exist").count(), 1, "{said}");
}

/// Setups only a change ends exit 2, not 4 (a supervisor retries 4 for ever): a search_path
/// naming no schema, and a database that does not exist, each said as what it is.
#[test]
fn a_missing_schema_or_database_is_exit_2() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    let nowhere = format!("{base}{separator}options=-c%20search_path%3Dno_such_schema_here");
    let out = oncebox(dir.path(), &["--database", &nowhere, "migrate"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("no schema of the search_path (no_such_schema_here)"),
        "{said}"
    );
    let (head, _) = base.rsplit_once('/').unwrap();
    let no_database = format!("{head}/no_such_database_here");
    let out = oncebox(dir.path(), &["--database", &no_database, "migrate"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("no_such_database_here"), "{said}");
}
