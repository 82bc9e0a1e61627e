//! Options of [`crate::Inbox::open`]: where the database is and how much of it to use.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Clock, SystemClock};

/// How to reach PostgreSQL and how to batch against it.
#[derive(Clone)]
pub struct Options {
    /// `postgres://user@host:port/database`.
    pub url: String,
    /// The schema oncebox's tables live in (`search_path`); `None` keeps the server's default
    /// (`public`). Lets several deployments or test runs share one database.
    pub schema: Option<String>,
    /// Connections in the pool. Batches, handlers and reads share them.
    pub max_connections: u32,
    /// How long a request waits for a connection, the longest wait for the batch queue, and
    /// the longest wait of oncebox's transactions (a handler's too) for a lock another
    /// transaction holds, before answering `Unavailable` instead of hanging while the database,
    /// or another node's transaction, is away. A handler that must wait longer for a lock sets
    /// its own `SET LOCAL lock_timeout`. Every session of the pool starts with it as its
    /// `lock_timeout`, the application's own queries on [`crate::Inbox::pool`] too. At most
    /// [`oncebox_core::LONGEST_WAIT`] (a longer one, `Duration::MAX` say, is taken as that).
    pub deadline: Duration,
    /// How long one of oncebox's transactions may sit idle, waiting for its node between
    /// statements, before the server ends it (`idle_in_transaction_session_timeout`). A node
    /// frozen or cut off in the middle of a transaction otherwise held its rows, the keys of
    /// its batch, until the server's TCP keepalive gave up on the session, hours later: every
    /// node answered those keys `Unavailable` all that time. A handler that pauses longer than
    /// this between two statements (an outside call inside its transaction) has its
    /// transaction ended, rolled back and answered `Unavailable`. One minute by default; zero
    /// leaves the server's setting.
    pub idle_in_transaction: Duration,
    /// The longest `open` waits for the lock migrations run under, held by another session:
    /// another node's migration of large tables may take minutes, but a session that stopped
    /// while holding it (its node frozen or cut off mid-migration) holds it until the server
    /// ends that session, and every node and command starting meanwhile waited with it,
    /// silently. Two minutes by default; past it `open` fails with
    /// `OpenError::MigrationLocked`, naming the session.
    pub migration_lock_wait: Duration,
    /// How long oncebox waits for PostgreSQL to answer one of its own units of work (a batch,
    /// a claim, a lease's write, a read, a readiness check) before it takes the connection for
    /// lost, closes it and answers `Unavailable` (`CommitUnknown` where a write may have been
    /// done). A connection whose network path went silent, with neither a reset nor a FIN
    /// (a failover that moved the server, a firewall that forgot the connection), otherwise
    /// held its worker or relay for good: sqlx sets no TCP keepalive. Also how long the relay
    /// wake-up connection may stay silent before it is checked the same way. Handlers'
    /// statements are not bounded. The bound is on each unit's whole time, not on silence
    /// alone: a read slower than it (a count over a huge table) is cut too. 30 s by default;
    /// at least four deadlines (the gateway's per-event path may wait one for a connection
    /// and one for each of its locks).
    pub lost_after: Duration,
    /// Batches in flight at once: several overlap their round trips and commits.
    pub batch_workers: usize,
    /// Requests combined into one set-based statement at most.
    pub max_batch: usize,
    /// Bytes one batch binds at most (payloads, once per route too, and answers): PostgreSQL
    /// refuses a value or a message past 1 GB. A single larger request still goes alone; set
    /// above [`MAX_EVENT_BYTES`](crate::MAX_EVENT_BYTES), it counts as that.
    pub max_batch_bytes: usize,
    /// Requests waiting for a batch at most; beyond it callers get `Unavailable::Busy` at once.
    pub queue_capacity: usize,
    /// What records are dated by and leases measured with; a manual clock in tests.
    pub clock: Arc<dyn Clock>,
    /// This machine's own wall clock, which the server's is compared with (`skew.rs`): the
    /// system's. Tests stand in one set wrong ([`Options::machine_clock`]).
    pub(crate) machine: Arc<dyn Clock>,
    /// Whether `open` creates the schema and brings it up to date (the default). Off, a
    /// missing or older schema is refused (`OpenError::SchemaOutdated`) and nothing is created
    /// or changed: for tools that look at or operate on a database other nodes keep, which a
    /// newer tool must not migrate under them.
    pub migrate: bool,
    /// The node's boot anchor, which finished records are dated by (`completed_at` never
    /// before the time it says: a clock stepped back makes no record old); set by `open` and
    /// kept up by purges.
    pub(crate) stamps: oncebox_core::Stamps,
    /// The channel this schema's relays listen on ([`crate::outbox_channel`]); set by `open`.
    pub(crate) channel: Arc<str>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("Options")
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("batch_workers", &self.batch_workers)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// The defaults for the database `url` names: its own `search_path`, a 5 s deadline, a
    /// one-minute limit on a transaction left idle, migrations on.
    pub fn new(url: impl Into<String>) -> Options {
        Options {
            url: url.into(),
            schema: None,
            max_connections: 16,
            deadline: Duration::from_secs(5),
            idle_in_transaction: Duration::from_secs(60),
            migration_lock_wait: Duration::from_secs(120),
            lost_after: crate::silent::LOST_AFTER,
            batch_workers: 4,
            max_batch: 256,
            max_batch_bytes: 64 << 20,
            queue_capacity: 16_384,
            clock: Arc::new(SystemClock),
            machine: Arc::new(SystemClock),
            migrate: true,
            stamps: Default::default(),
            channel: Arc::from(crate::OUTBOX_CHANNEL),
        }
    }

    /// Reads the URL as [`Inbox::open`](crate::Inbox::open) will, without connecting: a
    /// setting `open` would refuse (`sslmode=bogus`, a port that is no number, an unclosed
    /// `[`) is refused now, so a configuration check can say so. The error is the one `open`
    /// gives (`OpenError::Url`).
    pub fn check_url(&self) -> Result<(), crate::OpenError> {
        crate::inbox::connect_options(self).map(drop)
    }

    /// Sets [`Options::schema`].
    pub fn schema(mut self, schema: impl Into<String>) -> Options {
        self.schema = Some(schema.into());
        self
    }

    /// Sets [`Options::clock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Options {
        self.clock = clock;
        self
    }

    /// Stands in for this machine's wall clock where it is compared with the server's: a test's
    /// clock set wrong, to show what a node whose clock is off does. The system's otherwise.
    #[doc(hidden)]
    pub fn machine_clock(mut self, clock: Arc<dyn Clock>) -> Options {
        self.machine = clock;
        self
    }

    /// Sets [`Options::max_connections`].
    pub fn max_connections(mut self, n: u32) -> Options {
        self.max_connections = n.max(2);
        self
    }

    /// Sets [`Options::deadline`].
    pub fn deadline(mut self, t: Duration) -> Options {
        self.deadline = t;
        self
    }

    /// Sets [`Options::idle_in_transaction`].
    pub fn idle_in_transaction(mut self, t: Duration) -> Options {
        self.idle_in_transaction = t;
        self
    }

    /// Sets [`Options::migration_lock_wait`].
    pub fn migration_lock_wait(mut self, t: Duration) -> Options {
        self.migration_lock_wait = t;
        self
    }

    /// Sets [`Options::lost_after`].
    pub fn lost_after(mut self, t: Duration) -> Options {
        self.lost_after = t;
        self
    }

    /// [`Options::lost_after`] as applied: at least four deadlines (the gateway's per-event
    /// path waits up to one for a connection, and as long for each of its locks), within
    /// [`oncebox_core::LONGEST_WAIT`].
    pub(crate) fn silence(&self) -> Duration {
        let deadline = self.deadline.min(oncebox_core::LONGEST_WAIT);
        self.lost_after
            .max(deadline.saturating_mul(4))
            .min(oncebox_core::LONGEST_WAIT)
    }

    /// Sets [`Options::batch_workers`].
    pub fn batch_workers(mut self, n: usize) -> Options {
        self.batch_workers = n.max(1);
        self
    }

    /// Sets [`Options::max_batch`].
    pub fn max_batch(mut self, n: usize) -> Options {
        self.max_batch = n.max(1);
        self
    }

    /// Sets [`Options::max_batch_bytes`].
    pub fn max_batch_bytes(mut self, n: usize) -> Options {
        self.max_batch_bytes = n.max(1);
        self
    }

    /// Sets [`Options::migrate`].
    pub fn migrate(mut self, migrate: bool) -> Options {
        self.migrate = migrate;
        self
    }
}
