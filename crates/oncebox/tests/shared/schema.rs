//! A PostgreSQL schema of a test's own, shared by the `it` and `faults` test binaries: created
//! in the database a base URL names, given to nodes as their `search_path`, and dropped with
//! everything in it when the guard goes, whether the test passed or not.

#![allow(dead_code, reason = "each test binary uses a part of it")]

use oncebox_postgres::sqlx::{self, Connection, PgConnection, PgPool};

pub struct Schema {
    base: String,
    name: String,
    /// The base URL with the schema as `search_path`: what the nodes are given.
    pub url: String,
}

impl Schema {
    /// A new schema named `{prefix}_{uuid}` in the database `base` names.
    pub async fn create(base: &str, prefix: &str) -> Schema {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(base)
            .await
            .expect("connect to ONCEBOX_POSTGRES_URL");
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .expect("create the test's schema");
        let separator = if base.contains('?') { '&' } else { '?' };
        Schema {
            url: format!("{base}{separator}options[search_path]={name}"),
            base: base.to_owned(),
            name,
        }
    }

    /// A small pool on the schema, for the test's own reads.
    pub async fn pool(&self) -> PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await
            .expect("connect to the test's schema")
    }

    /// The schema's URL with the server's `host:port` replaced by `addr` (a fault proxy), in
    /// plain text so that the proxy sees the protocol.
    pub fn url_via(&self, addr: std::net::SocketAddr) -> String {
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let (auth, hostpath) = rest.rsplit_once('@').map_or(("", rest), |(a, h)| (a, h));
        let path = &hostpath[hostpath.find('/').unwrap_or(hostpath.len())..];
        let at = if auth.is_empty() { "" } else { "@" };
        oncebox_testkit::proxy::plaintext(&format!("{scheme}://{auth}{at}{addr}{path}"))
    }

    /// The server's address, for a proxy in front of it.
    pub fn server_addr(&self) -> std::net::SocketAddr {
        let rest = self.base.split_once("://").expect("a URL").1;
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let host = &host[..host.find(['/', '?']).unwrap_or(host.len())];
        let host = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:5432")
        };
        std::net::ToSocketAddrs::to_socket_addrs(&host)
            .expect("resolve the PostgreSQL host")
            .next()
            .expect("an address")
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // A runtime of its own on another thread: this may run inside the test's runtime.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = PgConnection::connect(&base).await.ok()?;
                sqlx::query(&format!("DROP SCHEMA {name} CASCADE"))
                    .execute(&mut conn)
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("warning: test schema {} was not dropped", self.name);
        }
    }
}
