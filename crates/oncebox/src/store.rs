//! The store a command runs on, chosen by the database URL at run time: SQLite or PostgreSQL,
//! the same binary, no rebuild. Each verb goes to the backend's own implementation.

use std::time::Duration;

use anyhow::{Context, Result};
use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
    StatusAnswer,
};
use oncebox_core::store::{
    Activity, ConflictFilter, ConflictRecord, EventFilter, EventStore, Ingest, Page, Stats,
    StoredEvent,
};
use oncebox_core::{
    Key, LeaseError, ProcessError, Processed, Record, Retention, Timestamp, Unavailable,
};

use crate::config::Storage;

mod url;

pub(crate) use url::joined_pairs;
pub use url::{describe, is_postgres, is_supported, sqlite_absent, sqlite_file};
use url::{lasting_problem, sqlite_path};

/// What opening an existing store does to a schema older than this build's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    Migrate,
    AsIs,
}

/// A store whose schema is older than this build's (or absent), opened without migrating:
/// nothing was decided, and the store is usable once migrated.
fn outdated(found: i64, known: i64) -> anyhow::Error {
    crate::exit::coded(
        crate::exit::Code::Unavailable,
        anyhow::anyhow!(
            "the database's schema is version {found} and this build's is {known}: run \
             `oncebox migrate` (or start `oncebox serve`) with this version first; this command \
             changes no schema"
        ),
    )
}

/// The TLS files a PostgreSQL URL names (`sslrootcert`, `sslcert`, `sslkey`) that cannot be
/// read: the driver says only "No such file or directory", without the file, and that read
/// as a server that is down (exit 4).
fn tls_files(database: &str) -> Result<()> {
    let query = database.split_once('?').map_or("", |(_, q)| q);
    for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        let named = matches!(
            key,
            "sslrootcert"
                | "ssl-root-cert"
                | "ssl-ca"
                | "sslcert"
                | "ssl-cert"
                | "sslkey"
                | "ssl-key"
        );
        // Escaped paths are left to the driver rather than decoded here.
        if named
            && !value.contains('%')
            && let Err(e) = std::fs::File::open(value)
        {
            return Err(crate::exit::usage(format!(
                "database URL's {key} {value}: {e}"
            )));
        }
    }
    Ok(())
}

/// One of the backends.
#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(oncebox_sqlite::Inbox),
    Postgres(oncebox_postgres::Inbox),
}

/// Calls the same method on whichever backend this is.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            Store::Sqlite($s) => $call,
            Store::Postgres($s) => $call,
        }
    };
}

impl Store {
    /// `open_with` for a command that only reads or changes what is stored: a SQLite file that does
    /// not exist is not created (with its schema) but named, since a mistyped path or another
    /// working directory would otherwise read as an empty store. `schema` says whether an
    /// older schema is brought up to date (the relay and the consumers, which run beside or
    /// instead of the gateway) or refused (operators' commands: a newer binary must not
    /// migrate a shared database under the nodes that keep it, nor create tables in a wrong
    /// one).
    /// Every command opens it tuned by `[storage]`, as `serve` does (a relay or a consumer run
    /// on its own writes to the same file, and an operator's command may too), but for the
    /// memory of answers, which only the commands that migrate (and so may take events) keep.
    pub async fn open_existing(database: &str, schema: Schema, storage: &Storage) -> Result<Store> {
        // Other schemes go to `open_inner`, which takes PostgreSQL and refuses the rest.
        if let Some(path) = sqlite_path(database) {
            // A missing directory is a mistake to fix (exit 2), as `migrate` would say: its
            // advice to run `migrate` would only fail.
            lasting_problem(path)?;
            match std::fs::metadata(path) {
                Ok(_) => {}
                // The store is not there yet: nothing was decided.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(crate::exit::coded(
                        crate::exit::Code::Unavailable,
                        anyhow::anyhow!(
                            "no database at {path}: `oncebox serve` or `oncebox migrate` \
                             creates it"
                        ),
                    ));
                }
                // A directory this user may not enter, say: not an absent file.
                Err(e) => return Err(crate::exit::usage(format!("cannot access {path}: {e}"))),
            }
        }
        let migrate = schema == Schema::Migrate;
        // An operator's command takes no events: a memory of answers would be sized (the
        // whole table is reserved up front) for nothing.
        let reads_only;
        let storage = if migrate {
            storage
        } else {
            reads_only = Storage {
                recent_answers: Some(0),
                ..storage.clone()
            };
            &reads_only
        };
        Store::open_inner(database, storage, migrate).await
    }

    /// Opens (and migrates) the store a URL names, tuned by `[storage]`: `sqlite://PATH` or a
    /// bare path, or `postgres://…` / `postgresql://…`.
    pub async fn open_with(database: &str, storage: &Storage) -> Result<Store> {
        Store::open_inner(database, storage, true).await
    }

    async fn open_inner(database: &str, storage: &Storage, migrate: bool) -> Result<Store> {
        if is_postgres(database) {
            tls_files(database)?;
            let options = oncebox_postgres::Options::new(database).migrate(migrate);
            let inbox = match oncebox_postgres::Inbox::open(options).await {
                Err(oncebox_postgres::OpenError::SchemaOutdated { found, known }) => {
                    return Err(outdated(found, known));
                }
                opened => opened.with_context(|| format!("opening {}", describe(database)))?,
            };
            return Ok(Store::Postgres(inbox));
        }
        let path = match sqlite_file(database) {
            Some(Ok(path)) => path,
            // Validation refuses these first; the checks stay for callers that skip it.
            Some(Err(why)) => {
                return Err(crate::exit::usage(format!(
                    "database {:?} {why}",
                    crate::config::redact_url(database)
                )));
            }
            None => {
                return Err(crate::exit::usage(format!(
                    "database {}: use sqlite://PATH or postgres://…",
                    crate::config::redact_url(database)
                )));
            }
        };
        lasting_problem(path)?;
        let mut options = oncebox_sqlite::Options::new(path);
        if let Some(keys) = storage.recent_answers {
            options = options.recent_answers(keys);
        }
        if let Some(placement) = storage.placement {
            options = options.placement(placement);
        }
        // Off the runtime's threads: the open waits out a busy file (up to its busy timeout, at
        // each step) and runs the migrations, and a stop asked for meanwhile (`Stop::before`)
        // must be noticed then, not once the open returned.
        let options = options.migrate(migrate);
        let opened = tokio::task::spawn_blocking(move || oncebox_sqlite::Inbox::open(options))
            .await
            .context("the open of the SQLite store ended without an answer")?;
        let inbox = match opened {
            Err(oncebox_sqlite::OpenError::SchemaOutdated { found, known }) => {
                return Err(outdated(found, known));
            }
            opened => opened.with_context(|| format!("opening {path}"))?,
        };
        Ok(Store::Sqlite(inbox))
    }

    /// The key's committed record.
    pub async fn record(&self, key: &Key) -> Result<Option<Record>> {
        Ok(match self {
            Store::Sqlite(s) => s.record(key).await?,
            Store::Postgres(s) => s.record(key).await?,
        })
    }
}

impl EventStore for Store {
    async fn ingest(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        each!(self, s => s.ingest(ingest).await)
    }

    async fn event(&self, key: &Key) -> Result<Option<StoredEvent>, Unavailable> {
        each!(self, s => EventStore::event(s, key).await)
    }

    async fn events(&self, filter: EventFilter) -> Result<Page<StoredEvent>, Unavailable> {
        each!(self, s => EventStore::events(s, filter).await)
    }

    async fn stats(&self) -> Result<Stats, Unavailable> {
        each!(self, s => EventStore::stats(s).await)
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Unavailable> {
        each!(self, s => EventStore::purge(s, now, retention).await)
    }

    async fn conflicts(&self, filter: ConflictFilter) -> Result<Page<ConflictRecord>, Unavailable> {
        each!(self, s => s.conflicts(filter).await)
    }

    async fn activity(&self, since: Timestamp, bucket: Duration) -> Result<Activity, Unavailable> {
        each!(self, s => s.activity(since, bucket).await)
    }

    async fn ready(&self) -> Result<(), Unavailable> {
        each!(self, s => s.ready().await)
    }
}

impl DeliveryStore for Store {
    async fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        each!(self, s => s.claim(now, limit, lease, routes).await)
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        each!(self, s => DeliveryStore::record(s, claimed, attempt, verdict, now).await)
    }

    async fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> Result<(), LeaseError> {
        each!(self, s => s.unclaim(claimed, now, due).await)
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        each!(self, s => s.deliveries(filter).await)
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        each!(self, s => s.attempts(id).await)
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        each!(self, s => s.retry(id, now).await)
    }

    async fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        each!(self, s => DeliveryStore::resolve(s, id, resolution, note, now).await)
    }

    async fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        each!(self, s => s.reconcile(id, attempts, answer, now).await)
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        each!(self, s => s.redeliver(key, now).await)
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        each!(self, s => s.gauges().await)
    }

    async fn wait_for_work(&self, at_most: Duration) {
        each!(self, s => s.wait_for_work(at_most).await)
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::store::{EventStore, Ingest};
    use oncebox_core::{Event, Key, Processed};

    use super::Store;
    use crate::config::Storage;

    /// How many of one retry's answers came from the memory of recent answers, on a SQLite
    /// store opened with `storage`.
    async fn retry_answered_from_memory(storage: &Storage, existing: bool) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("o.db").display());
        let opened = if existing {
            // As `relay`, `consume` and the operators' commands open it: made by another.
            drop(Store::open_with(&url, &Storage::default()).await.unwrap());
            Store::open_existing(&url, super::Schema::Migrate, storage).await
        } else {
            Store::open_with(&url, storage).await
        };
        let Store::Sqlite(inbox) = opened.unwrap() else {
            panic!("a SQLite URL opens SQLite");
        };
        let ingest = || Ingest {
            event: Event::json(Key::parse("shop", "evt_1").unwrap(), r#"{"n":1}"#).unwrap(),
            order: None,
            accepted: br#"{"status":"accepted"}"#.to_vec(),
            stale: Vec::new(),
            routes: Vec::new(),
        };
        assert!(matches!(
            inbox.ingest(ingest()).await,
            Ok(Processed::Applied(_))
        ));
        assert!(matches!(
            inbox.ingest(ingest()).await,
            Ok(Processed::Duplicate(_))
        ));
        inbox.stats().answered_from_memory()
    }

    /// `[storage] recent_answers` reaches the inbox, as `serve` and as every other command
    /// opens it: 0 turns the memory off, and without it the library's default answers the
    /// retry from memory.
    ///
    /// It runs inside figment's `Jail`, whose lock the configuration tests hold while they set
    /// environment variables: SQLite reads the environment (`SQLITE_TMPDIR`) from C when it
    /// first initializes, outside Rust's environment lock, and a run beside those tests
    /// crashed in `getenv` (2 runs in 150, seen in a core dump).
    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "figment's Jail fixes the closure's error type"
    )]
    fn recent_answers_reach_the_sqlite_inbox() {
        figment::Jail::expect_with(|_| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let off = Storage {
                    recent_answers: Some(0),
                    ..Storage::default()
                };
                for existing in [false, true] {
                    let default = retry_answered_from_memory(&Storage::default(), existing).await;
                    assert_eq!(default, 1, "existing {existing}");
                    let off = retry_answered_from_memory(&off, existing).await;
                    assert_eq!(off, 0, "existing {existing}");
                }
            });
            Ok(())
        });
    }
}
