//! What the scenarios share: the `oncebox` binary as a child process, senders that record every
//! request in a history, a PostgreSQL schema per scenario, and the final state read back from
//! SQLite or PostgreSQL for the checker.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oncebox_postgres::sqlx::{self, PgPool};
use oncebox_sqlite::rusqlite;
use oncebox_testkit::checker::Final;
use oncebox_testkit::child::{Proc, Ready, Spec};
use oncebox_testkit::history::{History, Key, Outcome, Refusal, key};

pub use crate::schema::Schema as PgSchema;

/// How long any one wait in a scenario may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Runs a scenario's async body on a runtime of its own, failing it after `limit`.
pub fn block_on<T>(limit: Duration, f: impl Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        tokio::time::timeout(limit, f)
            .await
            .unwrap_or_else(|_| panic!("scenario timed out after {limit:?}"))
    })
}

/// `oncebox serve` in `dir` (reading `dir/oncebox.toml` if there is one) on `database`,
/// listening on `listen`, ready once it printed its address.
pub fn serve(dir: &Path, database: &str, listen: &str, extra: &[&str]) -> Spec {
    Spec::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["--database", database, "serve", "--listen", listen])
        .args(extra)
        .dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .env("RUST_LOG", "warn")
        .ready(Ready::Stdout("oncebox listening on ".into()))
        .log(&dir.join("server.log"))
}

/// The base URL a started gateway printed.
pub fn url(p: &Proc) -> String {
    p.ready
        .split_whitespace()
        .next()
        .expect("address after the prefix")
        .to_owned()
}

/// A loopback address nobody listens on now, for a server that must come back on the same port.
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    l.local_addr().expect("address").to_string()
}

/// The JSON body of event `id` carrying payload tag `tag`.
pub fn body(id: &str, tag: &str) -> String {
    format!(r#"{{"id":"{id}","v":"{tag}"}}"#)
}

/// The tag a stored payload carries (`"v":"…"`), or the whole payload when it has none.
pub fn tag_of(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload);
    text.split_once(r#""v":""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or_else(|| text.to_string(), |(tag, _)| tag.to_owned())
}

/// A client for senders: no pooled connection survives a kill silently for long.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_idle_timeout(Duration::from_secs(1))
        .build()
        .expect("http client")
}

/// Sends one delivery of event `id` with payload `tag` to source `source` at `base`, recorded
/// in `history`; returns how it ended.
pub async fn deliver(
    c: &reqwest::Client,
    history: &History,
    base: &str,
    source: &str,
    id: &str,
    tag: &str,
) -> Outcome {
    let op = history.invoke(key(source, id), tag, None);
    let sent = c
        .post(format!("{base}/v1/sources/{source}/events"))
        .header("content-type", "application/json")
        .body(body(id, tag))
        .send()
        .await;
    let outcome = match sent {
        Ok(r) => Outcome::http(
            r.status().as_u16(),
            r.headers().contains_key("idempotent-replayed"),
        ),
        // Nothing left this machine's socket: the server was not there.
        Err(e) if e.is_connect() => Outcome::Fail(Refusal::Unreached),
        Err(e) => Outcome::Info(format!("no answer: {e}")),
    };
    op.end(outcome.clone());
    outcome
}

/// Sends event `id` until it is acknowledged or definitely refused, pausing `pace` between
/// attempts as a sender's retry policy would.
pub async fn deliver_until_done(
    c: &reqwest::Client,
    history: &History,
    base: &str,
    source: &str,
    id: &str,
    tag: &str,
) -> Outcome {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let o = deliver(c, history, base, source, id, tag).await;
        if matches!(o, Outcome::Ok { .. } | Outcome::Fail(Refusal::Conflict)) {
            return o;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{source}/{id} never accepted: {o:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Retries every request of the history that got no definite answer, with its own payload,
/// `parallel` at a time, until each is acknowledged or refused as a conflict: the senders'
/// side of the drain. A payload already acknowledged under its key is not sent again.
pub async fn drain(history: &Arc<History>, base: &str, parallel: usize) {
    let ops = history.ops();
    let definite = |key: &(String, String), payload: &str| {
        ops.iter().any(|o| {
            &o.key == key
                && o.payload == payload
                && match o.outcome() {
                    Some(Outcome::Ok { .. }) => true,
                    // Refused for what it is; a server that was not there decided nothing.
                    Some(Outcome::Fail(refusal)) => *refusal != Refusal::Unreached,
                    _ => false,
                }
        })
    };
    let mut owed: Vec<(String, String, String)> = Vec::new();
    for op in &ops {
        let wanted = (op.key.0.clone(), op.key.1.clone(), op.payload.clone());
        if !definite(&op.key, &op.payload) && !owed.contains(&wanted) {
            owed.push(wanted);
        }
    }
    let owed = Arc::new(std::sync::Mutex::new(owed));
    let workers: Vec<_> = (0..parallel)
        .map(|_| {
            let (owed, history, base) = (owed.clone(), history.clone(), base.to_owned());
            tokio::spawn(async move {
                let c = client();
                loop {
                    let Some((s, id, tag)) = owed.lock().unwrap().pop() else {
                        return;
                    };
                    deliver_until_done(&c, &history, &base, &s, &id, &tag).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("drain worker");
    }
}

/// The final state of a SQLite database: each completed inbox record is one effect (its
/// payload's tag) and one record stamped `completed_at`; records left `processing` or
/// `uncertain`, and with `outbox`, deliveries not `delivered`, are unresolved. Panics unless
/// `PRAGMA integrity_check` is ok.
pub fn final_sqlite(path: &Path, outbox: bool) -> Final {
    let c = rusqlite::Connection::open(path).expect("open the database");
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(ok, "ok", "SQLite integrity_check after the scenario");
    let mut s = c
        .prepare("SELECT source, event_id, state, completed_at, payload FROM oncebox_inbox")
        .unwrap();
    let rows = s
        .query_map([], |r| {
            Ok(InboxRow {
                source: r.get(0)?,
                event_id: r.get(1)?,
                state: r.get(2)?,
                completed_at: r.get(3)?,
                payload: r.get::<_, Option<Vec<u8>>>(4)?.unwrap_or_default(),
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect::<Vec<_>>();
    let deliveries: Vec<(String, String, String)> = if outbox {
        let mut s = c
            .prepare("SELECT source, event_id, state FROM oncebox_outbox")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    } else {
        Vec::new()
    };
    build(rows, &deliveries)
}

/// One inbox row as read back.
pub struct InboxRow {
    pub source: String,
    pub event_id: String,
    pub state: String,
    pub completed_at: Option<i64>,
    pub payload: Vec<u8>,
}

fn build(rows: Vec<InboxRow>, deliveries: &[(String, String, String)]) -> Final {
    let mut fin = Final::default();
    for r in rows {
        let k = key(&r.source, &r.event_id);
        match r.state.as_str() {
            "completed" => {
                fin.effects
                    .entry(k.clone())
                    .or_default()
                    .push(tag_of(&r.payload));
                fin.records.entry(k).or_default().push(r.completed_at);
            }
            "processing" | "uncertain" => fin.unresolved.push(k),
            _ => {}
        }
    }
    for (source, id, state) in deliveries {
        if state != "delivered" {
            fin.unresolved.push(key(source, id));
        }
    }
    fin
}

/// The final state of a PostgreSQL schema, read as [`final_sqlite`] reads SQLite.
pub async fn final_pg(pool: &PgPool, outbox: bool) -> Final {
    type Row = (String, String, String, Option<i64>, Option<Vec<u8>>);
    let rows: Vec<Row> =
        sqlx::query_as("SELECT source, event_id, state, completed_at, payload FROM oncebox_inbox")
            .fetch_all(pool)
            .await
            .expect("read the inbox");
    let deliveries: Vec<(String, String, String)> = if outbox {
        sqlx::query_as("SELECT source, event_id, state FROM oncebox_outbox")
            .fetch_all(pool)
            .await
            .expect("read the outbox")
    } else {
        Vec::new()
    };
    let rows = rows
        .into_iter()
        .map(
            |(source, event_id, state, completed_at, payload)| InboxRow {
                source,
                event_id,
                state,
                completed_at,
                payload: payload.unwrap_or_default(),
            },
        )
        .collect();
    build(rows, &deliveries)
}

/// A schema no other scenario uses, in the database `ONCEBOX_POSTGRES_URL` names: `None` (a
/// skip) without the variable.
pub async fn pg_schema() -> Option<PgSchema> {
    let base = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL")?;
    Some(PgSchema::create(&base, "oncebox_faults").await)
}

/// A scenario's store, its SQLite file or its PostgreSQL schema, for the counts it waits on
/// and checks, and the checker's final state.
pub struct StoreCounts {
    sqlite: std::path::PathBuf,
    pool: Option<PgPool>,
}

impl StoreCounts {
    /// The SQLite file at `sqlite`, or `schema` when the scenario runs on PostgreSQL.
    pub async fn new(sqlite: &Path, schema: Option<&PgSchema>) -> StoreCounts {
        let pool = match schema {
            Some(s) => Some(s.pool().await),
            None => None,
        };
        StoreCounts {
            sqlite: sqlite.to_owned(),
            pool,
        }
    }

    /// The number `sql` answers: a `SELECT count(*) …` of no parameters.
    pub async fn count(&self, sql: &str) -> usize {
        let n: i64 = match &self.pool {
            Some(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            None => rusqlite::Connection::open(&self.sqlite)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
        };
        n as usize
    }

    /// Waits until the deliveries in `state` are at least `n`, failing after [`PATIENCE`].
    pub async fn until_outbox(&self, state: &str, n: usize) {
        let sql = format!("SELECT count(*) FROM oncebox_outbox WHERE state = '{state}'");
        let deadline = std::time::Instant::now() + PATIENCE;
        while self.count(&sql).await < n {
            assert!(
                std::time::Instant::now() < deadline,
                "fewer than {n} deliveries {state} within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every delivery on the route `destination`, whatever its state, as its event's key and
    /// its payload's tag.
    pub async fn queued(&self, destination: &str) -> Vec<(Key, String)> {
        let sql = "SELECT source, event_id, payload FROM oncebox_outbox WHERE destination";
        self.tagged(sql, destination).await
    }

    /// Every conflict recorded on `source`, as its key and the offered payload's tag.
    pub async fn conflicts(&self, source: &str) -> Vec<(Key, String)> {
        let sql = "SELECT source, event_id, payload FROM oncebox_conflicts WHERE source";
        self.tagged(sql, source).await
    }

    /// The rows of `sql` (`SELECT source, event_id, payload … WHERE column`, completed here
    /// with `= value`), as key and payload tag.
    async fn tagged(&self, sql: &str, value: &str) -> Vec<(Key, String)> {
        let rows: Vec<(String, String, Option<Vec<u8>>)> = match &self.pool {
            Some(pool) => sqlx::query_as(&format!("{sql} = $1"))
                .bind(value)
                .fetch_all(pool)
                .await
                .expect("read the store"),
            None => {
                let c = rusqlite::Connection::open(&self.sqlite).expect("open the database");
                let mut s = c.prepare(&format!("{sql} = ?1")).unwrap();
                s.query_map([value], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
        };
        rows.into_iter()
            .map(|(source, id, payload)| (key(&source, &id), tag_of(&payload.unwrap_or_default())))
            .collect()
    }

    /// The checker's final state of this store (deliveries counted with `outbox`).
    pub async fn fin(&self, outbox: bool) -> Final {
        match &self.pool {
            Some(pool) => final_pg(pool, outbox).await,
            None => final_sqlite(&self.sqlite, outbox),
        }
    }
}
