//! The HTTP benchmark's load generator: the requests each connection sends, the loop that sends
//! them through one client per connection, the same load through the storage library without
//! HTTP, and the inbox's earlier events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, Processed};
use oncebox_sqlite::Inbox;
use tokio::task::JoinHandle;

use crate::measure::{Load, Run};

fn body(id: &str) -> String {
    format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":1}}"#)
}

/// `requests` fresh UUIDv4 events spread over the connections; with `duplicates`, every tenth
/// request of a connection repeats one it sent earlier instead (a sender's retry).
pub fn load(requests: usize, connections: usize, duplicates: bool) -> Load {
    (0..connections)
        .map(|c| {
            let n = requests / connections + usize::from(c < requests % connections);
            let mut mine: Vec<(String, String)> = Vec::with_capacity(n);
            for i in 0..n {
                if duplicates && i % 10 == 9 {
                    let again = mine[(i * 7 + c) % i].clone();
                    mine.push(again);
                } else {
                    let id = uuid::Uuid::new_v4().to_string();
                    let body = body(&id);
                    mine.push((id, body));
                }
            }
            mine
        })
        .collect()
}

/// Sends `load` through `clients` (one per connection, in parallel, each in sequence) and
/// times it from the first request to the last answer.
pub async fn drive(clients: &[reqwest::Client], url: &str, load: &Load) -> Run {
    let url: Arc<str> = url.into();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .zip(load)
        .map(|(client, mine)| {
            let (client, url, mine) = (client.clone(), url.clone(), mine.clone());
            tokio::spawn(async move {
                let mut run = Run::default();
                for (id, body) in mine {
                    let sent = Instant::now();
                    let answer = client
                        .post(&*url)
                        .header("content-type", "application/json")
                        .header("idempotency-key", id)
                        .body(body)
                        .send()
                        .await;
                    match answer {
                        Ok(response) => {
                            *run.statuses.entry(response.status().as_u16()).or_default() += 1;
                            run.replayed += usize::from(
                                response
                                    .headers()
                                    .get("idempotent-replayed")
                                    .is_some_and(|v| v == "true"),
                            );
                            // Read the body so the connection carries the next request.
                            let _ = response.bytes().await;
                        }
                        Err(_) => run.errors += 1,
                    }
                    run.latencies.push(sent.elapsed());
                    run.requests += 1;
                }
                run
            })
        })
        .collect();
    total(tasks, started).await
}

/// The storage library's ceiling for the gateway's write: `connections` callers, each calling
/// `EventStore::ingest` in sequence with what the gateway would hand it, no HTTP.
pub async fn drive_library<S: EventStore>(store: &S, load: &Load) -> Run {
    let started = Instant::now();
    let tasks: Vec<_> = load
        .iter()
        .map(|mine| {
            let (store, mine) = (store.clone(), mine.clone());
            tokio::spawn(async move {
                let mut run = Run::default();
                for (id, body) in mine {
                    let sent = Instant::now();
                    let key = Key::parse("bench", &id).expect("key");
                    let event = Event::json(key, body).expect("event");
                    let answer = store
                        .ingest(Ingest {
                            event,
                            order: None,
                            accepted: br#"{"status":"accepted"}"#.to_vec(),
                            stale: Vec::new(),
                            routes: Vec::new(),
                        })
                        .await;
                    let status = match answer {
                        Ok(Processed::Applied(_)) => 202,
                        Ok(_) => 200,
                        Err(_) => 503,
                    };
                    *run.statuses.entry(status).or_default() += 1;
                    run.latencies.push(sent.elapsed());
                    run.requests += 1;
                }
                run
            })
        })
        .collect();
    total(tasks, started).await
}

/// Waits for every caller's task and sums what they measured, timed from `started`.
async fn total(tasks: Vec<JoinHandle<Run>>, started: Instant) -> Run {
    let mut total = Run::default();
    for t in tasks {
        let run = t.await.expect("caller task");
        total.requests += run.requests;
        total.latencies.extend(run.latencies);
        for (s, n) in run.statuses {
            *total.statuses.entry(s).or_default() += n;
        }
        total.replayed += run.replayed;
        total.errors += run.errors;
    }
    total.elapsed = started.elapsed();
    total.latencies.sort_unstable();
    total
}

/// Fills the inbox with `n` earlier, completed events with random ids, 10 000 per transaction.
pub fn preload(inbox: &Inbox, n: usize) {
    for chunk in 0..n.div_ceil(10_000) {
        let rows = (n - chunk * 10_000).min(10_000);
        inbox
            .write_blocking(move |c| {
                let mut insert = c.prepare_cached(
                    "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, response,
                       payload, received_at, completed_at)
                     VALUES ('bench', ?1, ?2, 'completed', ?3, ?4, 0, 0)",
                )?;
                for _ in 0..rows {
                    let id = uuid::Uuid::new_v4().to_string();
                    let body = body(&id);
                    insert.execute(oncebox_sqlite::rusqlite::params![
                        id,
                        [7_u8; 32].as_slice(),
                        br#"{"status":"accepted"}"#.as_slice(),
                        body.as_bytes()
                    ])?;
                }
                Ok(())
            })
            .expect("preload");
    }
}

pub fn clients(connections: usize) -> Vec<reqwest::Client> {
    // One client per connection, each keeping its one connection alive between requests.
    (0..connections)
        .map(|_| {
            reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client")
        })
        .collect()
}
