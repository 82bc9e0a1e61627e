//! The quiet between two rounds of the HTTP benchmark: the stores' background writing left by
//! one round is finished before the next starts.

use std::path::Path;
use std::time::{Duration, Instant};

use oncebox_postgres::sqlx::{self, PgPool};

/// Waits out what a round left behind before the next one starts: log frames the checkpointer
/// has not yet copied into the database file. Without the wait one target's tail lands on the
/// next target's round: a library round at 55 000 events/s left the baseline's next round 15%
/// slower (50–51k against 57–60k requests/s with no library round in the phase), which read
/// as a better gateway/baseline ratio, and the gateway's own tail fell on the baseline's next
/// round the same way.
pub struct Settle {
    sqlite: oncebox_sqlite::rusqlite::Connection,
    /// The gateway-on-PostgreSQL target's store, when there is one: its server's buffers
    /// dirtied by a round are otherwise written out by its background writer and checkpointer
    /// during the rounds that follow. `None` also once a `CHECKPOINT` was refused.
    postgres: Option<(tokio::runtime::Handle, PgPool)>,
}

impl Settle {
    pub fn open(db: &Path) -> Settle {
        Settle {
            sqlite: oncebox_sqlite::rusqlite::Connection::open(db)
                .expect("open the inbox to settle it"),
            postgres: None,
        }
    }

    /// Settles PostgreSQL too, through `pool`, on `runtime`.
    pub fn with_postgres(self, runtime: tokio::runtime::Handle, pool: PgPool) -> Settle {
        Settle {
            postgres: Some((runtime, pool)),
            ..self
        }
    }

    /// Copies the rest of the log back, alongside the inbox's own checkpointer (a pass it is
    /// running answers busy, and this one tries again), until every frame is in the database
    /// file and synced there; gives up after ten seconds (a reader's old snapshot, say). Then
    /// has PostgreSQL, if any, write every dirty buffer out (`CHECKPOINT` returns once they
    /// are synced); autovacuum may still start later, which nothing here can wait for.
    pub fn wait(&mut self) {
        self.wait_sqlite();
        if let Some((runtime, pool)) = &self.postgres {
            let checkpoint = runtime.block_on(sqlx::query("CHECKPOINT").execute(pool));
            if let Err(e) = checkpoint {
                // CHECKPOINT needs a superuser or the pg_checkpoint role.
                println!("  (PostgreSQL not settled between rounds: CHECKPOINT refused: {e})");
                self.postgres = None;
            }
        }
    }

    fn wait_sqlite(&self) {
        let started = Instant::now();
        loop {
            let (busy, log, copied): (i64, i64, i64) = self
                .sqlite
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .expect("checkpoint");
            if busy == 0 && copied >= log {
                return;
            }
            if started.elapsed() > Duration::from_secs(10) {
                println!("  (the log was not settled after 10 s: {copied} of {log} frames copied)");
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
