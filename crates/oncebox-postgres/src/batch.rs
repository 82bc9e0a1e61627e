//! Batched ingest: concurrent gateway requests are combined into set-based statements
//! (`INSERT … SELECT FROM UNNEST(…) ON CONFLICT DO NOTHING RETURNING`), so one round trip and one
//! commit serve many requests. Several workers keep batches in flight at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use oncebox_core::store::Ingest;
use oncebox_core::{Fingerprint, ProcessError, Processed, Response, ResponseKind, Unavailable};
use sqlx::{PgPool, Row};
use tokio::sync::oneshot;

use crate::error::{commit_failed, storage};
use crate::limit;
use crate::options::Options;

mod deliveries;
mod gather;
mod stats;

use gather::gather;
pub use stats::BatchStats;

/// One request waiting for its batch.
pub(crate) struct Job {
    pub ingest: Ingest,
    pub deadline: Instant,
    pub answer: oneshot::Sender<Answer>,
}

/// What a batch tells a request: its answer, or that it must go through the per-event path
/// (its key holds a two-phase lease, or vanished between the insert and the read).
pub(crate) enum Answer {
    Done(Result<Processed, ProcessError>),
    Single(Box<Ingest>),
}

/// The queue in front of the batch workers. Workers end when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Batcher {
    sender: flume::Sender<Job>,
    pub stats: Arc<BatchStats>,
}

impl Batcher {
    pub fn start(pool: &PgPool, options: &Options) -> Batcher {
        let (sender, receiver) = flume::bounded::<Job>(options.queue_capacity.max(1));
        let stats = Arc::new(BatchStats::default());
        for _ in 0..options.batch_workers.max(1) {
            let (pool, receiver, options) = (pool.clone(), receiver.clone(), options.clone());
            let stats = stats.clone();
            tokio::spawn(async move {
                // A request taken from the queue that did not fit the last batch: it opens
                // the next one.
                let mut carried: Option<Job> = None;
                loop {
                    let first = match carried.take() {
                        Some(job) => job,
                        None => match receiver.recv_async().await {
                            Ok(job) => {
                                stats.held.fetch_add(1, Ordering::Relaxed);
                                job
                            }
                            Err(_) => break,
                        },
                    };
                    let jobs;
                    (jobs, carried) = gather(first, &receiver, &options, &stats);
                    run(&pool, &options, &stats, jobs).await;
                }
            });
        }
        Batcher { sender, stats }
    }

    /// Requests in the queue, not yet taken by a worker.
    pub fn queued(&self) -> usize {
        self.sender.len()
    }

    /// Queues `ingest`; a full queue is `Busy` at once, so an overloaded node sheds load fast.
    /// An event PostgreSQL cannot store is refused, and one whose deliveries a batch's array
    /// could not carry goes the per-event way, before either joins a batch: a statement failing
    /// for it would fail every request beside it, on every try.
    pub async fn submit(&self, ingest: Ingest, deadline: Instant) -> Answer {
        if let Err(refused) = limit::check(&ingest.event) {
            return Answer::Done(Err(refused));
        }
        if limit::too_heavy_for_a_batch(&ingest) {
            return Answer::Single(Box::new(ingest));
        }
        let (answer, receiver) = oneshot::channel();
        let job = Job {
            ingest,
            deadline,
            answer,
        };
        if self.sender.try_send(job).is_err() {
            return Answer::Done(Err(ProcessError::Unavailable(Unavailable::Busy)));
        }
        match tokio::time::timeout_at(deadline.into(), receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Answer::Done(Err(ProcessError::Unavailable(Unavailable::Closed))),
            // The batch may still commit: the sender's retry then reads it as a duplicate.
            Err(_) => Answer::Done(Err(ProcessError::Unavailable(Unavailable::Deadline))),
        }
    }
}

/// Runs `jobs` as batches: the first request of each key now, any further request of a key
/// already in the batch in the next round, when the first one's record is committed.
async fn run(pool: &PgPool, options: &Options, stats: &BatchStats, mut jobs: Vec<Job>) {
    loop {
        // Each round: a request whose caller stopped waiting is dropped; its sender retries.
        let now = Instant::now();
        jobs.retain_mut(|job| {
            if job.deadline <= now {
                stats.held.fetch_sub(1, Ordering::Relaxed);
                return false;
            }
            true
        });
        if jobs.is_empty() {
            return;
        }
        let mut seen = HashSet::new();
        let (first, later): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| seen.insert(j.ingest.event.key.clone()));
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        // A batch whose connection went silent would hold this worker for good (`silent.rs`);
        // given up on, it may still have committed, which its requests' retries read.
        let limit = options.silence();
        let answers = crate::silent::or_unknown(limit, batch(pool, options, &first)).await;
        stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        let answers = match answers {
            // A lock wait that ran out (another transaction holding one of the keys: a node
            // frozen with it open, a long handler) says nothing of the other keys. Each goes
            // the per-event way, where only the held key waits again: failed together, every
            // request batched beside a held key was refused, on every retry of that key.
            Err(Unavailable::Busy) if first.len() > 1 => {
                stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                for job in first {
                    let _ = job.answer.send(Answer::Single(Box::new(job.ingest)));
                    stats.held.fetch_sub(1, Ordering::Relaxed);
                }
                jobs = later;
                continue;
            }
            Ok(answers) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
                stats
                    .requests
                    .fetch_add(first.len() as u64, Ordering::Relaxed);
                answers
            }
            Err(why) => first
                .iter()
                .map(|_| Answer::Done(Err(ProcessError::Unavailable(why.clone()))))
                .collect(),
        };
        for (job, answer) in first.into_iter().zip(answers) {
            let _ = job.answer.send(answer);
            stats.held.fetch_sub(1, Ordering::Relaxed);
        }
        jobs = later;
    }
}

/// A stored record as a batch reads it: fingerprint, state, response.
type Found = (Vec<u8>, String, Option<Vec<u8>>);

/// One transaction for requests with distinct keys; their answers in order. Any failure fails
/// them all as `Unavailable` (a failed `COMMIT` as `CommitUnknown`): never a duplicate answer
/// without a committed row (G3).
async fn batch(pool: &PgPool, options: &Options, jobs: &[Job]) -> Result<Vec<Answer>, Unavailable> {
    // Rows are inserted in key order, so two batches sharing keys lock them in the same order
    // and cannot deadlock.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|a, b| jobs[*a].ingest.event.key.cmp(&jobs[*b].ingest.event.key));
    let ev = |i: usize| &jobs[i].ingest.event;
    let sources: Vec<&str> = order.iter().map(|i| ev(*i).key.source.as_str()).collect();
    let ids: Vec<&str> = order.iter().map(|i| ev(*i).key.event_id.as_str()).collect();
    let prints: Vec<&[u8]> = order
        .iter()
        .map(|i| &ev(*i).fingerprint.as_bytes()[..])
        .collect();
    let responses: Vec<&[u8]> = order
        .iter()
        .map(|i| &jobs[*i].ingest.accepted[..])
        .collect();
    let payloads: Vec<&[u8]> = order.iter().map(|i| &ev(*i).payload[..]).collect();
    let types: Vec<Option<&str>> = order
        .iter()
        .map(|i| ev(*i).meta.content_type.as_deref())
        .collect();
    let headers: Vec<Option<String>> = order
        .iter()
        .map(|i| ev(*i).meta.header_lines().map(str::to_owned))
        .collect();

    // Its lock waits get half the time its most pressed request has left, and at least a
    // quarter of the deadline (a request near its end must not turn every short wait into a
    // fallback): a batch that gives up on a held key leaves its requests time to go the
    // per-event way (`run`).
    let now = Instant::now();
    let left = jobs
        .iter()
        .map(|j| j.deadline.saturating_duration_since(now))
        .min();
    let wait = (left.unwrap_or(options.deadline) / 2).max(options.deadline / 4);
    let mut tx = crate::inbox::begin(pool, wait)
        .await
        .map_err(|e| storage(&e))?;
    crate::crash::point!("after-begin");
    // Read after a connection was had (which may wait): the stamp is as close to the commit as
    // the clock can know.
    let now = options.clock.now();
    let stamp = options
        .stamps
        .completed(options.clock.as_ref(), now)
        .millis();
    let now = now.millis();
    let inserted: HashSet<(String, String)> = sqlx::query(
        "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, response, payload,
           received_at, completed_at, content_type, headers)
         SELECT s, e, f, 'completed', r, p, $8, $9, ct, h
         FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::bytea[], $6::text[],
                     $7::text[]) AS t(s, e, f, r, p, ct, h)
         ON CONFLICT (source, event_id) DO NOTHING RETURNING source, event_id",
    )
    .bind(&sources)
    .bind(&ids)
    .bind(&prints)
    .bind(&responses)
    .bind(&payloads)
    .bind(&types)
    .bind(&headers)
    .bind(now)
    .bind(stamp)
    .fetch_all(&mut *tx)
    .await
    .map_err(|e| storage(&e))?
    .into_iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect::<Result<_, sqlx::Error>>()
    .map_err(|e| storage(&e))?;
    crate::crash::point!("after-inbox-insert");
    let is_new = |i: usize| {
        let k = &ev(i).key;
        inserted.contains(&(k.source.as_str().to_owned(), k.event_id.as_str().to_owned()))
    };

    // Deliveries of the new events, one per route, in the same transaction.
    let new: Vec<&Ingest> = order
        .iter()
        .filter(|i| is_new(**i))
        .map(|i| &jobs[*i].ingest)
        .collect();
    deliveries::queue(&mut tx, &new, now, &options.channel).await?;
    // The gateway's effect is its deliveries, queued above.
    crate::crash::point!("after-effect");

    // Keys that existed: decide from their committed records.
    let old: Vec<usize> = order.iter().copied().filter(|i| !is_new(*i)).collect();
    let mut existing: HashMap<(String, String), Found> = HashMap::new();
    if !old.is_empty() {
        let s: Vec<&str> = old.iter().map(|i| ev(*i).key.source.as_str()).collect();
        let e: Vec<&str> = old.iter().map(|i| ev(*i).key.event_id.as_str()).collect();
        let rows = sqlx::query(
            "SELECT i.source, i.event_id, i.fingerprint, i.state, i.response
             FROM oncebox_inbox i JOIN UNNEST($1::text[], $2::text[]) AS k(s, e)
               ON i.source = k.s AND i.event_id = k.e",
        )
        .bind(&s)
        .bind(&e)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| storage(&e))?;
        for r in rows {
            let read = (|| -> Result<_, sqlx::Error> {
                Ok((
                    (r.try_get(0)?, r.try_get(1)?),
                    (r.try_get(2)?, r.try_get(3)?, r.try_get(4)?),
                ))
            })()
            .map_err(|e| storage(&e))?;
            existing.insert(read.0, read.1);
        }
    }
    let mut answers: Vec<Option<Answer>> = (0..jobs.len()).map(|_| None).collect();
    let mut conflicts = Vec::new();
    for i in 0..jobs.len() {
        let ingest = &jobs[i].ingest;
        let key = &ingest.event.key;
        if is_new(i) {
            answers[i] = Some(Answer::Done(Ok(Processed::Applied(Response::completed(
                ingest.accepted.clone(),
            )))));
            continue;
        }
        let found = existing.get(&(
            key.source.as_str().to_owned(),
            key.event_id.as_str().to_owned(),
        ));
        let answer = match found {
            // Perhaps this event stored the way an earlier version fingerprinted it: the
            // per-event path reads the stored payload to tell.
            Some((stored, _, _))
                if stored[..] != ingest.event.fingerprint.as_bytes()[..]
                    && ingest.event.recheck.is_some() =>
            {
                Answer::Single(Box::new(ingest.clone()))
            }
            Some((stored, _, _)) if stored[..] != ingest.event.fingerprint.as_bytes()[..] => {
                conflicts.push((i, stored.clone()));
                let stored = Fingerprint::from_slice(stored).unwrap_or(ingest.event.fingerprint);
                Answer::Done(Err(ProcessError::Conflict {
                    stored,
                    offered: ingest.event.fingerprint,
                }))
            }
            Some((_, state, body)) => match ResponseKind::parse(state) {
                Some(kind) => Answer::Done(Ok(Processed::Duplicate(Response {
                    kind,
                    body: body.clone().unwrap_or_default(),
                }))),
                None if state == "uncertain" => Answer::Done(Err(ProcessError::Uncertain)),
                // A two-phase lease (live or expired): the per-event path decides.
                None => Answer::Single(Box::new(ingest.clone())),
            },
            None => Answer::Single(Box::new(ingest.clone())),
        };
        answers[i] = Some(answer);
    }
    if !conflicts.is_empty() {
        let s: Vec<&str> = conflicts
            .iter()
            .map(|(i, _)| ev(*i).key.source.as_str())
            .collect();
        let e: Vec<&str> = conflicts
            .iter()
            .map(|(i, _)| ev(*i).key.event_id.as_str())
            .collect();
        let st: Vec<&[u8]> = conflicts.iter().map(|(_, f)| &f[..]).collect();
        let of: Vec<&[u8]> = conflicts
            .iter()
            .map(|(i, _)| &ev(*i).fingerprint.as_bytes()[..])
            .collect();
        let p: Vec<&[u8]> = conflicts.iter().map(|(i, _)| &ev(*i).payload[..]).collect();
        sqlx::query(
            "INSERT INTO oncebox_conflicts (source, event_id, stored_fingerprint,
               offered_fingerprint, payload, at)
             SELECT s, e, st, o, p, $6
             FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::bytea[])
               AS t(s, e, st, o, p)",
        )
        .bind(&s)
        .bind(&e)
        .bind(&st)
        .bind(&of)
        .bind(&p)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(|e| storage(&e))?;
    }
    crate::crash::point!("before-commit");
    tx.commit().await.map_err(|e| commit_failed(&e))?;
    crate::crash::point!("after-commit");
    Ok(answers
        .into_iter()
        .map(|a| {
            a.unwrap_or(Answer::Done(Err(ProcessError::Unavailable(
                Unavailable::Busy,
            ))))
        })
        .collect())
}
