//! oncebox-testkit: the conformance suite every backend runs, a model-based test and helpers;
//! only ever a dev-dependency.
//!
//! A backend implements [`Backend`] once in its own tests and instantiates every test with
//! `oncebox_testkit::conformance!(MyBackend);`. Handlers are described as a [`Script`] that the
//! backend translates into real SQL on its own transaction, so the suite is written once for
//! every backend and still exercises real effects.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ManualClock, ProcessError, Processed, Response,
    Retention, Timestamp,
};

pub mod checker;
pub mod child;
pub mod consume;
pub mod damage;
pub mod history;
pub mod leasing;
mod model;
mod nats_keep;
pub mod pg;
pub mod proxy;
pub mod rabbit;
pub mod race;
pub mod receiver;
pub mod relay;
pub mod seed;
pub mod suite;
pub mod tls;
pub mod wrapped;
pub mod writer;

/// What a test handler does, in order: check the entity version (stale stops here), check the
/// offset watermark (a replay ends with body `replay` and no effect), credit `amount` to
/// `account` recording one effect row for the key, take the action key `("email", email)` and,
/// if first, record the email and enqueue an outbox message for it, enqueue each of `notes`,
/// then end as `end` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub amount: i64,
    pub account: i64,
    pub version: Option<(String, i64)>,
    pub offset: Option<(String, i64, i64)>,
    pub email: Option<String>,
    /// `(key, body)` of messages for destination `notes`: a completion's body is then what
    /// each `enqueue` answered (`Queued`, `Already`, `Conflict`), joined by commas.
    pub notes: Vec<(String, String)>,
    pub end: End,
}

/// How a scripted handler ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Complete(String),
    Reject(String),
    /// Returns a handler error after its effects.
    Fail,
    /// Panics after its effects.
    Panic,
}

impl Script {
    /// Credits `amount` to account 1 and completes with body `ok`.
    pub fn credit(amount: i64) -> Script {
        Script {
            amount,
            account: 1,
            version: None,
            offset: None,
            email: None,
            notes: Vec::new(),
            end: End::Complete("ok".into()),
        }
    }

    pub fn end(mut self, end: End) -> Script {
        self.end = end;
        self
    }

    pub fn account(mut self, account: i64) -> Script {
        self.account = account;
        self
    }

    pub fn email(mut self, key: &str) -> Script {
        self.email = Some(key.to_owned());
        self
    }

    pub fn note(mut self, key: &str, body: &str) -> Script {
        self.notes.push((key.to_owned(), body.to_owned()));
        self
    }

    pub fn version(mut self, entity_id: &str, version: i64) -> Script {
        self.version = Some((entity_id.to_owned(), version));
        self
    }

    pub fn offset(mut self, stream: &str, partition: i64, offset: i64) -> Script {
        self.offset = Some((stream.to_owned(), partition, offset));
        self
    }
}

/// The committed state a test can see, read from the backend's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Effect rows per key: a value above 1 is a double apply.
    pub effects: BTreeMap<(String, String), i64>,
    /// Balance of account 1.
    pub balance: i64,
    pub emails: Vec<String>,
    /// `(destination, idempotency_key)` of queued outbox messages.
    pub outbox: Vec<(String, String)>,
    pub inbox_rows: i64,
    pub conflicts: i64,
}

impl Observed {
    pub fn effects_of(&self, key: &Key) -> i64 {
        let k = (
            key.source.as_str().to_owned(),
            key.event_id.as_str().to_owned(),
        );
        self.effects.get(&k).copied().unwrap_or(0)
    }

    /// Keys applied more than once (the figure D).
    pub fn doubles(&self) -> usize {
        self.effects.values().filter(|n| **n > 1).count()
    }
}

/// Where [`Backend::crash`] kills the process delivering an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashAt {
    /// In the handler, after its effects, before the transaction commits.
    BeforeCommit,
    /// After the commit, before the answer reaches the caller. The store's state is taken
    /// once its answer came back and thrown away: nothing is written between a COMMIT and its
    /// answer, so this is what a kill right after the COMMIT leaves.
    AfterCommit,
}

/// How a delivery run by [`Backend::crash`] ended.
#[derive(Debug)]
pub enum Crashed {
    /// The process died at the point; no answer was seen.
    Died,
    /// The delivery never reached the point (a duplicate, a conflict, a failing handler) and
    /// was answered; the process died after answering.
    Answered(Result<Processed, ProcessError>),
}

/// A backend under test. Each call is one request to the real store.
pub trait Backend: Clone + Send + Sync + Sized + 'static {
    /// A new, empty store on `clock`, with account 1 (balance 0) in the test tables
    /// (`test_accounts`, `test_effects`, `test_emails`).
    fn fresh(clock: ManualClock) -> impl Future<Output = Self> + Send;
    /// Closes the store and opens the same storage again (an orderly restart).
    fn reopen(self) -> impl Future<Output = Self> + Send;
    /// A second handle on the same storage while this one stays open: another process on the
    /// same file, another node on the same database.
    fn another(&self) -> impl Future<Output = Self> + Send;
    /// Delivers `event` in a process killed at `at`, and returns the store a new process opens
    /// on what the dead one left: the files as they were at that moment (SQLite), the
    /// server's state after the dead client's session is gone (PostgreSQL).
    fn crash(
        self,
        event: Event,
        script: Script,
        at: CrashAt,
    ) -> impl Future<Output = (Self, Crashed)> + Send;
    fn process(
        &self,
        event: Event,
        script: Script,
    ) -> impl Future<Output = Result<Processed, ProcessError>> + Send;
    fn begin(
        &self,
        event: Event,
        ttl: Duration,
    ) -> impl Future<Output = Result<Begun, ProcessError>> + Send;
    fn complete(
        &self,
        lease: &Lease,
        response: Response,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
    fn uncertain(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// Settles an uncertain key: `Some(response)` completed, `None` released. False when the key
    /// was not uncertain.
    fn resolve(&self, key: &Key, completed: Option<Response>) -> impl Future<Output = bool> + Send;
    fn purge(&self, now: Timestamp, retention: &Retention) -> impl Future<Output = u64> + Send;
    /// Records every due outbox message delivered, as a relay whose receiver answered 200 does
    /// (see [`relay::deliver_due`]); returns how many.
    fn deliver_due(&self, now: Timestamp) -> impl Future<Output = usize> + Send;
    fn observe(&self) -> impl Future<Output = Observed> + Send;
    /// The store's own counts for operators (`EventStore::stats`).
    fn stats(&self) -> impl Future<Output = oncebox_core::store::Stats> + Send;
    /// Deletes every boot's purge anchor, as an operator releasing purges held behind the
    /// clock does with SQL (the stores' purge-lag warning says how).
    fn forget_purge_anchors(&self) -> impl Future<Output = ()> + Send;
    /// Holds the store's writes until the returned guard is dropped (SQLite's writer held
    /// busy, PostgreSQL's inbox table locked by another session): requests sent meanwhile
    /// wait, so a test can have them all sent before any is answered (`race.rs`).
    fn hold_writes(&self) -> impl Future<Output = Box<dyn std::any::Any + Send>> + Send;
    /// How many requests wait behind [`Backend::hold_writes`] now, as the store shows it: in
    /// SQLite's writer queue, or PostgreSQL sessions waiting for the inbox table's lock. Two
    /// or more is the proof that requests met in the store, not only in the test.
    fn held_requests(&self) -> impl Future<Output = usize> + Send;

    /// Whether the storage this backend needs is there; a backend on an outside service
    /// answers with [`service_url`], which skips (or fails under `ONCEBOX_REQUIRE_SERVICES=1`)
    /// when it is not.
    fn available() -> bool {
        true
    }
}

/// Runs an async test on a multi-threaded runtime with a timeout, so a hang fails instead of
/// blocking CI.
pub fn run<F: Future<Output = ()>>(test: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("test timed out after 60 s");
    });
}

/// The URL of an outside service (PostgreSQL, Redis, RabbitMQ, NATS) a test needs, read from the
/// environment variable `var`. When it is unset the test says so on stderr and gets `None` (it
/// skips), unless `ONCEBOX_REQUIRE_SERVICES=1`, which turns every skip into a failure: CI sets it,
/// so a suite that silently skipped there could not pass.
pub fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => {
            if var == "ONCEBOX_NATS_URL" {
                nats_keep::keep(&url);
            }
            Some(url)
        }
        _ if std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") => {
            panic!("{var} is not set and ONCEBOX_REQUIRE_SERVICES=1: this test needs the service")
        }
        _ => {
            eprintln!("SKIPPED: {var} is not set; this test needs the service it names");
            None
        }
    }
}

/// The path of a program a test drives (a browser, a WebDriver server), when it is installed
/// and executable. When it is absent the test says so on stderr and gets `None` (it skips),
/// unless `ONCEBOX_REQUIRE_SERVICES=1`, which turns the skip into a failure, as for
/// [`service_url`].
pub fn require_program(path: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let found =
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    match found {
        true => Some(std::path::PathBuf::from(path)),
        false if std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") => {
            panic!("{path} is not installed and ONCEBOX_REQUIRE_SERVICES=1: this test needs it")
        }
        false => {
            eprintln!("SKIPPED: {path} is not installed; this test needs it");
            None
        }
    }
}

/// A benchmark's `--name N` command-line option, or `default` when absent or not a number.
pub fn bench_arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One thread of this process as Linux's `schedstat` counts it, for benchmarks that split CPU
/// time by thread name.
#[derive(Debug, Clone)]
pub struct ThreadTime {
    /// The thread's name (`comm`).
    pub name: String,
    /// Nanoseconds on a CPU.
    pub on: u64,
    /// Nanoseconds runnable but waiting for a CPU.
    pub waiting: u64,
}

/// Every live thread of this process with its CPU time; empty where `/proc` has no per-thread
/// `schedstat` (it is finer than `/proc/self/stat`'s 10 ms ticks).
pub fn thread_times() -> Vec<ThreadTime> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|task| {
            let path = task.path();
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
            let mut fields = stat
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0));
            ThreadTime {
                name: name.trim_end().to_owned(),
                on: fields.next().unwrap_or(0),
                waiting: fields.next().unwrap_or(0),
            }
        })
        .collect()
}

/// The CPUs each live thread of this process named `name` may run on, as the kernel lists
/// them (`Cpus_allowed_list`: "0-1", "3"); empty where `/proc` has no such thread.
pub fn thread_cpus(name: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            comm.trim_end() == name
        })
        .filter_map(|task| allowed_cpus(&task.path().join("status")))
        .collect()
}

/// The CPUs this process may run on, as the kernel lists them; `None` where `/proc` has no
/// such line.
pub fn process_cpus() -> Option<String> {
    allowed_cpus("/proc/self/status".as_ref())
}

/// `Cpus_allowed_list` of a `/proc` status file.
fn allowed_cpus(status: &std::path::Path) -> Option<String> {
    let status = std::fs::read_to_string(status).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(list.trim().to_owned())
}

/// A fixed start time for manual clocks: 2026-01-01T00:00:00Z.
pub const EPOCH: Timestamp = Timestamp(1_767_225_600_000);

/// A JSON event for `source`/`id` with payload `{"amount": amount}`.
pub fn event(source: &str, id: &str, amount: i64) -> Event {
    let key = Key::parse(source, id).expect("valid test key");
    Event::json(key, format!(r#"{{"amount":{amount}}}"#)).expect("valid test payload")
}

/// Instantiates the whole conformance suite for a backend type: one `#[test]` per behaviour.
#[macro_export]
macro_rules! conformance {
    ($backend:ty) => {
        $crate::conformance!(@tests $backend;
            first_delivery_applies_and_stores_its_response,
            duplicate_replays_first_response_without_running_handler,
            same_key_with_different_payload_is_a_conflict_and_first_payload_wins,
            equal_json_in_another_spelling_is_a_duplicate,
            handler_failure_rolls_back_everything_and_retry_applies,
            handler_panic_rolls_back_and_other_events_commit,
            sql_error_in_handler_leaves_no_inbox_row,
            rejection_is_stored_and_replayed_without_effect,
            same_event_id_from_two_sources_is_two_events,
            concurrent_deliveries_of_one_key_apply_once,
            action_key_sends_one_email_for_two_events,
            fifty_events_racing_for_one_action_key_send_one_email,
            a_nul_in_an_action_key_or_entity_id_fails_the_handler,
            older_entity_version_is_stale_and_changes_nothing,
            offset_at_or_below_watermark_is_a_replay,
            outbox_message_commits_only_with_the_effect,
            a_second_message_under_a_key_says_whether_it_was_the_same,
            stats_count_the_rows_kept_forever,
            action_keys_and_versions_outlive_their_records_purge,
            restart_keeps_every_committed_key,
            process_waits_behind_a_lease_and_an_uncertain_key,
            process_parks_an_expired_two_phase_lease_uncertain,
            purge_deletes_only_terminal_records_past_retention,
            purge_beside_ingest_never_deletes_inside_the_window,
            forward_clock_jump_purges_no_record_early,
            a_purge_time_ahead_of_the_clock_purges_nothing_early,
            forward_clock_jump_then_restart_purges_no_record_early,
            a_clock_stepped_back_then_set_right_makes_no_record_old,
            a_clock_behind_at_open_then_set_right_makes_no_record_old,
            records_dated_ahead_of_the_clock_hold_no_purge_back,
            a_deleted_boot_anchor_lets_purges_follow_the_clock_again,
            backward_clock_jump_leaves_no_lease_stuck,
            model_based_sequences_match_the_model,
        );
        $crate::lease_conformance!($crate::leasing::SqlLeases<$backend>);
    };
    (@tests $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if <$backend as $crate::Backend>::available() {
                    $crate::run($crate::suite::$name::<$backend>());
                }
            }
        )*
    };
}
