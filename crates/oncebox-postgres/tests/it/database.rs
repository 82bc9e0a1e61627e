//! A database of a test's own, for tests of `NOTIFY`: channels are per database, so other
//! tests' ingest in the shared one would wake these tests' relays and prove nothing.

use oncebox_postgres::sqlx::{self, Connection, PgConnection};

use crate::harness;

/// A fresh database on the test server; [`OwnDatabase::drop`] removes it.
#[derive(Debug)]
pub struct OwnDatabase {
    pub url: String,
    name: String,
    admin: PgConnection,
}

impl OwnDatabase {
    /// `None` (skipping) when no test server is configured.
    pub async fn create() -> Option<OwnDatabase> {
        let url = harness::url()?;
        let mut admin = PgConnection::connect(&url).await.expect("connect");
        let name = format!("oncebox_t_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        // The same server and parameters, another database.
        let (base, params) = url.split_once('?').unwrap_or((url.as_str(), ""));
        let (server, _) = base.rsplit_once('/').expect("URL names a database");
        let sep = if params.is_empty() { "" } else { "?" };
        Some(OwnDatabase {
            url: format!("{server}/{name}{sep}{params}"),
            name,
            admin,
        })
    }

    /// Removes the database, closing whatever connections are left on it.
    pub async fn drop(mut self) {
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut self.admin)
            .await
            .expect("drop database");
    }
}
