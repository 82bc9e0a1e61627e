//! oncebox-redis: the two-phase lease of DESIGN §8 on Redis — fenced leases with a TTL for
//! effects no SQL transaction covers, and a duplicate cache — never the final guard.
//!
//! `begin` takes the key with a fencing token (`INCR`) and a TTL: the key is `processing`
//! until the holder calls `complete` (`done`, kept with its first response for the source's
//! retention), `release` (the effect failed: the key is free again) or `uncertain` (parked
//! until `resolve`). Every change is a Lua script that compares the holder's token first, so a
//! holder whose lease was taken over cannot complete, release or park the key, and one whose
//! lease ended cannot complete it. An ended lease's record is kept as long again as the lease:
//! a `begin` in that time takes it over and says so (`Lease::taken_over`), and its holder may
//! still park the key `uncertain` while no one took it over, as on the SQL stores.
//!
//! # What Redis can promise
//!
//! - **One holder at a time, while Redis remembers** (and its clock does not jump ahead,
//!   below). A script runs alone, so two workers on any number of nodes never both get the
//!   lease from one Redis.
//! - **Fenced writes.** A late holder's `complete`/`release`/`uncertain` is refused
//!   (`LeaseError::Fenced`); it cannot overwrite the answer of the holder that took over —
//!   as long as no token is handed out twice (below).
//! - **Tokens that grow while the Redis host's clock does.** A token is the next value of a
//!   counter, but never below the Redis host's wall clock in microseconds, so a restart that
//!   forgot the counter still counts on — if that clock has not gone back.
//! - **Honest errors.** A timeout, an outage or an odd reply is `Unavailable`, never `Duplicate`.
//!
//! # What Redis cannot promise
//!
//! - **It is not a transaction with your database.** Between your effect and `complete` there
//!   is always a gap; a crash in it leaves the key `processing` until the TTL, then the next
//!   delivery performs the effect again — unless a durable record says it happened.
//! - **A restarted Redis forgets.** Without persistence everything is gone; with RDB the last
//!   minutes, with AOF `everysec` the last second. Leases, `done` answers and `uncertain` marks
//!   vanish, and a redelivery gets a fresh lease. So does a failover to a replica that had not
//!   received the last writes (replication is asynchronous), and eviction under `maxmemory`
//!   (use `maxmemory-policy noeviction`; `Leases::connect` warns of any other, and
//!   `Leases::eviction_policy` names it).
//! - **A lease does not stop a paused holder.** A holder paused (GC, SIGSTOP, a slow network)
//!   past its TTL does not know it; its external call may still go out. Fencing refuses its
//!   writes here; only a receiver that checks the token (or the idempotency key) refuses the call.
//! - **No audit.** A conflicting payload is answered `Conflict` but not recorded: pass it on to
//!   the SQL inbox, which records it (below).
//! - **Tokens and expiry are only as good as the Redis host's wall clock.** A restart after
//!   that clock stepped back, or a failover to a replica whose clock lags (and whose counter may
//!   miss the last writes), can hand out tokens lower than, or equal to, tokens already handed
//!   out: a receiver that refuses older tokens then refuses the new holder, and an old holder
//!   carrying a token handed out again passes Redis's fence. Redis also ends every TTL on that
//!   clock: a forward jump (or a failover to a host whose clock runs ahead) ends leases before
//!   their `Lease::expires_at`, and nothing tells the holder; a backward one keeps them longer,
//!   by no more than one lease: the first `begin` that finds a lease ending further ahead than
//!   its own length re-anchors it to one length from then. Keep the host's clock slewed by
//!   NTP, never stepped.
//!
//! So Redis buys speed — cheap exclusion across nodes, duplicates answered without a database
//! round trip — and the SQL inbox remains the guard. Needs Redis 5 or later (scripts that read
//! `TIME` before writing), one primary, not Redis Cluster.
//!
//! # Redis in front of the SQL inbox
//!
//! The pattern that keeps one effect whatever Redis forgets: Redis first, the inbox's durable
//! lease second, the effect, then the inbox's completion before Redis's. A restarted Redis hands
//! out a fresh lease, and the inbox answers `Duplicate` (or `InProgress`) instead of a second
//! effect. Redis down: the inbox decides alone.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use oncebox_core::{Begun, Event, ProcessError, Response};
//! use oncebox_redis::Leases;
//! use oncebox_sqlite::Inbox;
//!
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//! const TTL: Duration = Duration::from_secs(30); // longer than the call's own timeout
//!
//! /// Sends the receipt for `event` once, from any number of nodes, whatever Redis forgets.
//! async fn receipt_once(redis: &Leases, inbox: &Inbox, event: Event) -> Result<Response, Error> {
//!     // 1. Redis: cheap exclusion across nodes, and answers cached after earlier commits.
//!     let fast = match redis.begin(&event, TTL).await {
//!         Ok(Begun::Duplicate(first)) => return Ok(first), // written only after the inbox committed
//!         Ok(Begun::Leased(lease)) => Some(lease),
//!         Err(ProcessError::Unavailable(_)) => None, // Redis is down: the inbox alone decides
//!         // Another payload: the inbox records it for the audit (G4) and answers it. Uncertain:
//!         // the inbox says whether an operator settled it since (a Redis mark outlives that).
//!         Err(ProcessError::Conflict { .. } | ProcessError::Uncertain) => None,
//!         Err(other) => return Err(other.into()),    // in progress elsewhere
//!         Ok(_) => None,
//!     };
//!     // 2. The SQL inbox: the durable lease, the final guard. It remembers what Redis forgot.
//!     let lease = match inbox.begin(event.clone(), TTL).await {
//!         Ok(Begun::Leased(lease)) => lease,
//!         answer => {
//!             // Done before (Redis had forgotten), in progress, conflict: no effect here.
//!             // Not `complete` for a duplicate: Redis would keep the answer a whole retention
//!             // from now, past the inbox's record (`remember` can cache it from its
//!             // `completed_at`).
//!             if let Some(fast) = &fast {
//!                 let _ = redis.release(fast).await;
//!             }
//!             return match answer {
//!                 Ok(Begun::Duplicate(first)) => Ok(first),
//!                 Ok(_) => Err("unexpected answer".into()),
//!                 Err(e) => Err(e.into()),
//!             };
//!         }
//!     };
//!     // An earlier holder's lease ended unfinished (`taken_over`): its receipt may have gone
//!     // out. Unless the receiver refuses older tokens or honours an idempotency key, park the
//!     // key for an operator (`resolve`) rather than send a second receipt.
//!     if lease.taken_over {
//!         inbox.uncertain(&lease).await?;
//!         if let Some(fast) = &fast {
//!             let _ = redis.release(fast).await;
//!         }
//!         return Err("an earlier attempt may have sent the receipt: parked uncertain".into());
//!     }
//!     // 3. The effect. Give the receiver `lease.token` if it can refuse older tokens.
//!     match send_receipt(&event, lease.token).await {
//!         Ok(response) => {
//!             // The inbox first: Redis may only say "done" about what the inbox committed.
//!             inbox.complete(&lease, response.clone()).await?;
//!             if let Some(fast) = &fast {
//!                 let _ = redis.complete(fast, &response).await; // fenced or down: only a cache
//!             }
//!             Ok(response)
//!         }
//!         Err(failed) => {
//!             // Outcome unknown instead? `inbox.uncertain(&lease)` parks the key; Redis's lease
//!             // is still released: the inbox's mark is the one an operator settles.
//!             inbox.release(&lease).await?;
//!             if let Some(fast) = &fast {
//!                 let _ = redis.release(fast).await;
//!             }
//!             Err(failed)
//!         }
//!     }
//! }
//! # async fn send_receipt(_: &Event, _: i64) -> Result<Response, Error> { unimplemented!() }
//! ```
//!
//! For effects inside the database, step 2 is `inbox.process(event, handler)`, and Redis's
//! `complete` follows an `Applied` outcome (a `Duplicate`: `release`, as above). A gateway on
//! several nodes can use [`Leases::recall`] before the inbox and [`Leases::remember`] after its
//! commit as a duplicate cache; `remember` takes the record's completion time, so the copy
//! expires when the inbox may purge the record, not a whole retention after the call.

mod cache;
mod error;
mod leases;
mod link;
mod options;
mod scripts;
mod server;

pub use error::ConnectError;
pub use leases::{Leases, Resolution};
pub use options::Options;
pub use redis;

/// The longest response `Leases::complete` keeps: Redis takes one argument, and keeps one
/// value, of at most `proto-max-bulk-len` bytes (512 MiB unless its configuration lowers it).
/// A longer one failed the same way on every retry, as `Unavailable`, with the connection
/// dropped; it is refused as `LeaseError::TooLarge` instead, the lease still the holder's.
pub const MAX_RESPONSE_BYTES: usize = 512 << 20;
