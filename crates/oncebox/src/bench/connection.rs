//! One connection of `oncebox bench`: which event it sends next, the request itself, and what it
//! records of each answer. The closed and the open loop drive it alike.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use oncebox_core::{Clock, SystemClock};
use oncebox_gateway::policy::SourcePolicy;
use serde_json::json;

use super::{Class, ConnectionReport, Outcome, REQUEST_TIMEOUT, Target};
use crate::client;

/// One event as sent: the id the sender puts in headers, the id the gateway will store it
/// under (differs only for derived ids), and the body, resent unchanged by duplicates.
#[derive(Clone)]
pub(super) struct Sent {
    id: String,
    stored_as: String,
    body: String,
}

/// A sender on one HTTP connection. Its duplicates resend an id this connection sent before,
/// whose answer it already has, so a duplicate never races its original.
pub(super) struct Connection {
    client: reqwest::Client,
    target: Arc<Target>,
    duplicates: f64,
    rng: u64,
    sent: Vec<Sent>,
    repeated: usize,
    pub(super) report: ConnectionReport,
}

impl Connection {
    /// Connection number `index` of the run; `duplicates` is the share of repeats it sends.
    pub(super) fn new(target: Arc<Target>, duplicates: f64, index: usize) -> Result<Connection> {
        // One pooled connection per sender: the connection count is exactly `--connections`.
        let client = crate::client::http()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        Ok(Connection {
            client,
            target,
            duplicates,
            rng: seed(index),
            sent: Vec::new(),
            repeated: 0,
            report: ConnectionReport::default(),
        })
    }

    /// The next request: a repeat of an earlier id while repeats are behind their share, else
    /// a new event.
    pub(super) fn next_event(&mut self) -> Result<(Class, Sent)> {
        // Duplicates are spread evenly: after k requests, floor(k·share) were repeats.
        let k = self.report.outcomes.len() + 1;
        let due = (k as f64 * self.duplicates) as usize;
        if self.repeated < due && !self.sent.is_empty() {
            self.repeated += 1;
            let pick = (next(&mut self.rng) % self.sent.len() as u64) as usize;
            return Ok((Class::Duplicate, self.sent[pick].clone()));
        }
        let event = new_event(&self.target.policy)?;
        self.sent.push(event.clone());
        Ok((Class::New, event))
    }

    /// Sends `event` and records its answer, with the latency counted from `since`: the send
    /// itself in the closed loop, the request's due time in the open loop.
    pub(super) async fn send(&mut self, class: Class, event: &Sent, since: Instant) {
        let answer = send(&self.client, &self.target, event).await;
        let latency = since.elapsed();
        let report = &mut self.report;
        let state = report.keys.entry(event.stored_as.clone()).or_default();
        let status = match answer {
            Ok((status, replayed)) => {
                let success = (200..300).contains(&status);
                if success && !replayed && state.acked {
                    report.reaccepted.push(event.stored_as.clone());
                }
                let overloaded = matches!(status, 429 | 503);
                if !success && !overloaded && state.acked {
                    report.refused_again.push(event.stored_as.clone());
                }
                state.acked |= success;
                // 503 may mean "commit outcome unknown" (DESIGN §4): the key may be stored.
                state.uncertain |= status == 503;
                Some(status)
            }
            Err(e) => {
                state.uncertain = true;
                report.first_error.get_or_insert_with(|| format!("{e:#}"));
                None
            }
        };
        report.outcomes.push(Outcome {
            class,
            status,
            latency,
        });
    }
}

/// A per-connection seed, so connections pick different earlier ids to repeat.
fn seed(connection: usize) -> u64 {
    0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(connection as u64 + 1)
}

/// xorshift64: enough to pick which earlier id a duplicate repeats.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A fresh UUIDv4 event, with the id wherever the source's rule looks for it.
fn new_event(policy: &SourcePolicy) -> Result<Sent> {
    let id = uuid::Uuid::new_v4().to_string();
    let mut doc = json!({
        "id": id,
        "type": "oncebox.bench",
        "amount": 1,
        "created": SystemClock.now().millis() / 1000,
    });
    client::place_id(&policy.event_id, &mut doc, &id);
    let body = doc.to_string();
    let stored_as = client::stored_id(&policy.event_id, &body, &id)?;
    Ok(Sent {
        id,
        stored_as,
        body,
    })
}

/// Posts one event, signed now (a sender's retry is signed again, with the same body).
async fn send(client: &reqwest::Client, target: &Target, event: &Sent) -> Result<(u16, bool)> {
    let policy = &target.policy;
    let request = client
        .post(&target.ingest_url)
        .header("content-type", "application/json")
        .body(event.body.clone());
    let body = event.body.as_bytes();
    let request = client::identified(request, policy, &event.id, body, SystemClock.now());
    // Without its URL: `--url` may carry credentials, and the first error is printed.
    let response = request.send().await.map_err(reqwest::Error::without_url)?;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    // Read the body so the connection can carry the next request; the status already decided.
    let _ = response.bytes().await;
    Ok((status, replayed))
}
