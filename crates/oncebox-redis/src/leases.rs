//! `Leases`, the public handle: the two-phase form of DESIGN §8 on Redis — `begin` takes a
//! fenced lease with a TTL, then `complete`, `release` or `uncertain`; `resolve` settles an
//! uncertain key.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{
    Begun, Event, Fingerprint, Key, Lease, LeaseError, ProcessError, Response, ResponseKind,
    Unavailable,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, ScriptInvocation, Value};

use crate::error::{ConnectError, at_connect, check_namespace, odd_reply, too_large};
use crate::link::{Link, read_only};
use crate::options::Options;
use crate::scripts::{Scripts, fence_key, record_key};

/// Longest TTL or retention sent to Redis (about 100 years): Redis refuses an expiry that
/// overflows its clock, and "forever" should not become an error.
pub(crate) const MAX_MILLIS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// How an operator settles a key left `uncertain`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The external effect did happen: the key is done and replays this response.
    Completed(Response),
    /// It did not happen: the key is free again and a retry performs it.
    Released,
}

/// Fenced leases on one Redis (a primary, not Redis Cluster: the begin script touches the
/// fence counter and the record, which Cluster would need in one slot). Cheap to clone; clones
/// share one multiplexed connection that reconnects by itself.
#[derive(Clone)]
pub struct Leases {
    link: Arc<Link>,
    shared: Arc<Shared>,
}

struct Shared {
    options: Options,
    scripts: Scripts,
    fence: String,
    /// What [`Leases::eviction_policy`] reports.
    eviction: Option<String>,
}

/// How many times `begin` is repeated while whether it ran is unknown.
const REPEATS: usize = 3;

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases")
            .field("namespace", &self.shared.options.namespace)
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// Connects to `url` (`redis://host:port/db`, `rediss://…` over TLS); fails when Redis does
    /// not answer within the deadline (one for the whole connect: its first connection, the
    /// connection manager's and the server probes share it). Later outages are answered `Unavailable` per call while
    /// the connection reconnects in the background. Needs a tokio runtime with timers enabled.
    pub async fn connect(url: &str, mut options: Options) -> Result<Leases, ConnectError> {
        check_namespace(&options.namespace)?;
        // Each call's cutoff is now plus the deadline: an unbounded one (`Duration::MAX` for
        // "no deadline") overflowed the clock, a panic in every call.
        options.deadline = options.deadline.min(oncebox_core::LONGEST_WAIT);
        // rustls picks its crypto provider from its crate features, and a program whose
        // dependencies enable both or neither of them would panic at the first TLS handshake:
        // ring is installed as the process default unless one already is.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = match &options.root_certificate {
            None => redis::Client::open(url),
            Some(pem) => {
                let certificates = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                };
                redis::Client::build_with_tls(url, certificates)
            }
        }
        .map_err(ConnectError::Url)?;
        // One plain attempt first: the connection manager retries a failing first connection
        // until the deadline, and a refused certificate or password would then read only as
        // the deadline. Its own timeouts are the deadline too: the client's defaults (1 s to
        // connect, 500 ms per answer) failed a TLS handshake over a slow link however long the
        // caller's deadline was.
        let first = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.deadline))
            .set_response_timeout(Some(options.deadline));
        let connecting = client.get_multiplexed_async_connection_with_config(&first);
        // One cutoff for every step: each under a deadline of its own, `connect` over a slow
        // link took up to three deadlines.
        let cutoff = tokio::time::Instant::now() + options.deadline;
        match tokio::time::timeout_at(cutoff, connecting).await {
            Err(_) => return Err(Unavailable::Deadline.into()),
            Ok(Err(e)) => return Err(at_connect(&e).into()),
            Ok(Ok(_)) => {}
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.deadline))
            .set_response_timeout(Some(options.deadline));
        let connecting = ConnectionManager::new_with_config(client.clone(), config.clone());
        let mut conn = match tokio::time::timeout_at(cutoff, connecting).await {
            Err(_) => return Err(Unavailable::Deadline.into()),
            Ok(Err(e)) => return Err(at_connect(&e).into()),
            Ok(Ok(conn)) => conn,
        };
        // The probes share the cutoff: each waits through the connection manager's retries,
        // so a Redis that stopped answering after the first connection held `connect` for
        // several deadlines.
        let probes = async {
            crate::server::refuse_unsupported(&mut conn).await?;
            Ok::<_, ConnectError>(crate::server::eviction(&mut conn).await)
        };
        let eviction = match tokio::time::timeout_at(cutoff, probes).await {
            Err(_) => return Err(Unavailable::Deadline.into()),
            Ok(probed) => probed?,
        };
        if let Some(policy) = &eviction {
            tracing::warn!(
                policy,
                "Redis may evict keys when it runs out of memory (maxmemory-policy {policy}): \
                 a lease or a done record can vanish, and the key is taken again; set \
                 maxmemory-policy noeviction"
            );
        }
        Ok(Leases {
            link: Arc::new(Link::new(client, config, conn)),
            shared: Arc::new(Shared {
                fence: fence_key(&options.namespace),
                options,
                scripts: Scripts::new(),
                eviction,
            }),
        })
    }

    pub fn options(&self) -> &Options {
        &self.shared.options
    }

    /// The eviction policy Redis reported at connect when it may drop keys under memory
    /// pressure (a `maxmemory` set and any policy but `noeviction`: the `volatile-*` ones too,
    /// since every lease and record has a TTL), from `CONFIG GET` or else `INFO memory`.
    /// `None` when it never evicts, or when it would say neither (warned of at connect).
    pub fn eviction_policy(&self) -> Option<&str> {
        self.shared.eviction.as_deref()
    }

    /// Takes a lease on the event's key for `ttl`, with a fencing token larger than every token
    /// this namespace handed out before (while the Redis host's clock does not go back: see the
    /// crate docs). A key Redis holds answers from its record instead:
    /// `Duplicate` (done, same payload), `InProgress` (leased, with the time left), `Conflict`
    /// (another payload; not recorded here — the SQL inbox keeps the audit) or `Uncertain`.
    ///
    /// `Unavailable` says nothing about the key: if only the reply was lost, the lease may
    /// have been taken, and the key answers `InProgress` until its TTL runs out. A TTL under
    /// 1 ms is `Invalid::LeaseTtl`, as on the SQL stores.
    pub async fn begin(&self, event: &Event, ttl: Duration) -> Result<Begun, ProcessError> {
        oncebox_core::check_ttl(ttl)?;
        let (ttl_ms, expires_at) = lease_ttl(self.shared.options.clock.now(), ttl);
        // Names this call, so that repeated after its reply was lost it is answered with the
        // lease it took (`scripts.rs`).
        let attempt = uuid::Uuid::new_v4().simple().to_string();
        let mut call = self.shared.scripts.begin.prepare_invoke();
        call.key(&self.shared.fence)
            .key(self.record(&event.key))
            .arg(&event.fingerprint.as_bytes()[..])
            .arg(ttl_ms)
            .arg(&attempt);
        let reply = self.repeated_while_unknown(&call).await?;
        let parts = array(&reply).ok_or_else(|| odd_reply("begin", &reply))?;
        let odd = || ProcessError::from(odd_reply("begin", &reply));
        match (parts.first().and_then(text), parts.get(1), parts.get(2)) {
            (Some(b"leased"), Some(token), Some(taken)) => {
                let token = integer(token).ok_or_else(odd)?;
                Ok(Begun::Leased(Lease {
                    key: event.key.clone(),
                    token,
                    expires_at,
                    // Told while the ended lease's record is kept (as long again as the lease);
                    // one older than that vanished with its key, and looks like a first lease.
                    taken_over: integer(taken).ok_or_else(odd)? == 1,
                }))
            }
            (Some(b"done"), Some(kind), Some(body)) => {
                let kind = text(kind)
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(ResponseKind::parse)
                    .ok_or_else(odd)?;
                let body = text(body).ok_or_else(odd)?.to_vec();
                Ok(Begun::Duplicate(Response { kind, body }))
            }
            (Some(b"busy"), Some(left), None) => {
                let left = integer(left).ok_or_else(odd)?;
                // An earlier build's lease without an end answers its key's TTL, which is -1
                // when the key has none: a second, not a retry at once and again.
                let left = u64::try_from(left)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .unwrap_or(1000);
                Err(ProcessError::InProgress {
                    retry_after: Duration::from_millis(left),
                })
            }
            (Some(b"conflict"), Some(stored), None) => {
                // A record without a fingerprint of 32 bytes is none our scripts wrote: no
                // verdict on it, and no stored fingerprint made up for the audit.
                let stored = text(stored)
                    .and_then(Fingerprint::from_slice)
                    .ok_or_else(odd)?;
                Err(ProcessError::Conflict {
                    stored,
                    offered: event.fingerprint,
                })
            }
            (Some(b"uncertain"), None, None) => Err(ProcessError::Uncertain),
            _ => Err(odd()),
        }
    }

    /// Marks the key done with its first response, kept for the source's retention from the
    /// lease's start, which came before the inbox's completion (so the mark goes no later
    /// than the inbox may purge the record): call it right after the inbox's own completion, not for a key the inbox answered as a
    /// duplicate (its record is older; [`Leases::remember`] counts from its completion). Refused
    /// (`Fenced`) once the lease expired, was taken over, or Redis forgot it. Repeating a
    /// completion that succeeded (its reply was lost) answers `Ok` again. A response past
    /// [`MAX_RESPONSE_BYTES`](crate::MAX_RESPONSE_BYTES) is `TooLarge`, unasked of Redis, and
    /// the lease is still the holder's.
    pub async fn complete(&self, lease: &Lease, response: &Response) -> Result<(), LeaseError> {
        if let Some(why) = too_large(response) {
            return Err(LeaseError::TooLarge(why));
        }
        let mut call = self.shared.scripts.complete.prepare_invoke();
        call.key(self.record(&lease.key))
            .arg(lease.token)
            .arg(response.kind.as_str())
            .arg(&response.body[..])
            .arg(self.retention(&lease.key));
        self.fenced_write("complete", &call).await
    }

    /// The external effect failed: frees the key now rather than at the TTL. Refused once the
    /// lease is no longer this holder's.
    pub async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let mut call = self.shared.scripts.release.prepare_invoke();
        call.key(self.record(&lease.key)).arg(lease.token);
        self.fenced_write("release", &call).await
    }

    /// The external effect's outcome is unknown: parks the key (no TTL) until `resolve`.
    /// Refused (`Fenced`) once the lease is no longer this holder's. Repeating a call that
    /// parked the key (its reply was lost) answers `Ok` again, until `resolve` settles it.
    pub async fn uncertain(&self, lease: &Lease) -> Result<(), LeaseError> {
        let mut call = self.shared.scripts.uncertain.prepare_invoke();
        call.key(self.record(&lease.key)).arg(lease.token);
        self.fenced_write("uncertain", &call).await
    }

    /// Settles an uncertain key; `Ok(false)` when the key was not uncertain.
    pub async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<bool, Unavailable> {
        // Past Redis's limit it would close the connection every call shares.
        if let Resolution::Completed(r) = &resolution
            && let Some(why) = too_large(r)
        {
            return Err(Unavailable::Storage(why));
        }
        let mut call = self.shared.scripts.resolve.prepare_invoke();
        call.key(self.record(key));
        match &resolution {
            Resolution::Completed(r) => call.arg("completed").arg(r.kind.as_str()).arg(&r.body[..]),
            Resolution::Released => call.arg("released").arg("").arg(""),
        };
        call.arg(self.retention(key));
        let reply = self.run(&call).await?;
        match reply {
            Value::Int(n) => Ok(n == 1),
            other => Err(odd_reply("resolve", &other)),
        }
    }

    async fn fenced_write(
        &self,
        what: &str,
        call: &ScriptInvocation<'_>,
    ) -> Result<(), LeaseError> {
        let reply = self.run(call).await?;
        match text(&reply) {
            Some(b"ok") => Ok(()),
            Some(b"fenced") => Err(LeaseError::Fenced),
            _ => Err(odd_reply(what, &reply).into()),
        }
    }

    pub(crate) fn record(&self, key: &Key) -> Vec<u8> {
        record_key(&self.shared.options.namespace, key)
    }

    pub(crate) fn retention(&self, key: &Key) -> u64 {
        millis(self.shared.options.retention.for_source(&key.source))
    }

    /// Runs a script. One refused by a replica (`READONLY` or `MASTERDOWN`: a failover behind
    /// this address) is sent again once on a new connection: nothing of it ran. The refusal,
    /// the new connection and the second try all share the one deadline, so a call never takes
    /// longer than it.
    pub(crate) async fn run(&self, call: &ScriptInvocation<'_>) -> Result<Value, Unavailable> {
        let cutoff = tokio::time::Instant::now() + self.shared.options.deadline;
        self.run_by(call, cutoff).await
    }

    /// `run`, answered by `cutoff`.
    async fn run_by(
        &self,
        call: &ScriptInvocation<'_>,
        cutoff: tokio::time::Instant,
    ) -> Result<Value, Unavailable> {
        let (generation, mut conn) = self.link.get();
        let first = tokio::time::timeout_at(cutoff, call.invoke_async(&mut conn)).await;
        if let Ok(reply) = &first
            && read_only(reply)
            && self.link.replace(generation, cutoff).await
        {
            let (_, mut conn) = self.link.get();
            return answer(tokio::time::timeout_at(cutoff, call.invoke_async(&mut conn)).await);
        }
        answer(first)
    }

    /// `call`, repeated (up to [`REPEATS`] times, all within the one deadline) while whether
    /// it ran is unknown: its reply was lost, or a proxy answered in its place. Only for a call
    /// that answers its own repetition as it answered itself (`begin`, by its attempt id).
    /// Before, a `begin` whose reply was lost could not be repeated by its own caller: the
    /// repetition was answered busy, and the key waited out the lease nobody knew it held. A
    /// repetition that fails too, or finds no time left, leaves it unknown.
    async fn repeated_while_unknown(
        &self,
        call: &ScriptInvocation<'_>,
    ) -> Result<Value, Unavailable> {
        let cutoff = tokio::time::Instant::now() + self.shared.options.deadline;
        let first = self.run_by(call, cutoff).await;
        let Err(Unavailable::CommitUnknown(why)) = first else {
            return first;
        };
        for _ in 0..REPEATS {
            if tokio::time::Instant::now() >= cutoff {
                break;
            }
            // A connection the lost reply took with it may fail the first repetition before
            // it is replaced; any answer from Redis ends the doubt.
            if let Ok(reply) = self.run_by(call, cutoff).await {
                return Ok(reply);
            }
        }
        Err(Unavailable::CommitUnknown(why))
    }

    /// Bounds a Redis call by the deadline. A call cut off here may still run on the server:
    /// its outcome is unknown, which is exactly what `Unavailable` says.
    pub(crate) async fn timed(
        &self,
        call: impl Future<Output = RedisResult<Value>>,
    ) -> Result<Value, Unavailable> {
        answer(tokio::time::timeout(self.shared.options.deadline, call).await)
    }

    pub(crate) fn scripts(&self) -> &Scripts {
        &self.shared.scripts
    }

    pub(crate) fn connection(&self) -> ConnectionManager {
        self.link.get().1
    }
}

mod reply;

use reply::{answer, integer, lease_ttl, millis};
pub(crate) use reply::{array, text};
