//! Fifty simultaneous deliveries of one key split between two `oncebox serve` processes on one
//! store (a SQLite file, a PostgreSQL schema): one 202, 49 replays of that answer, one stored
//! event. Neither process can see the other's memory, so the loser learns of the winner only
//! through the store: its lock (SQLite's write lock, PostgreSQL's unique index) and the record.
//! That they raced is shown, not assumed: requests to the loser left before the winner answered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use crate::nodes::{Node, gateway, run_within};
use crate::schema::Schema;

const CONFIG: &str = r#"
listen = "127.0.0.1:0"
[sources.race]
signature = "none"
event_id = { pointer = "/id" }
"#;
const SENDERS: usize = 50;
/// Keys raced one after another; each is a race of its own.
const ROUNDS: usize = 5;

/// One answer: which process gave it, its status, whether it said replayed, its body, and when
/// its request was sent and its answer came.
#[derive(Debug)]
struct Answer {
    node: usize,
    status: u16,
    replayed: bool,
    body: String,
    sent: Instant,
    answered: Instant,
}

/// Races `SENDERS` deliveries of `id`, alternating between the processes at `urls`, each from
/// a connection of its own opened before the barrier.
async fn race(urls: &[String; 2], id: &str) -> Vec<Answer> {
    let barrier = Arc::new(Barrier::new(SENDERS));
    let senders: Vec<_> = (0..SENDERS)
        .map(|i| {
            let (barrier, url, id) = (barrier.clone(), urls[i % 2].clone(), id.to_owned());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let ready = client.get(format!("{url}/healthz")).send().await.unwrap();
                assert!(ready.status().is_success());
                barrier.wait().await;
                let sent = Instant::now();
                let r = client
                    .post(format!("{url}/v1/sources/race/events"))
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"id":"{id}","amount":1}}"#))
                    .send()
                    .await
                    .unwrap();
                let answered = Instant::now();
                Answer {
                    node: i % 2,
                    status: r.status().as_u16(),
                    replayed: r.headers().contains_key("idempotent-replayed"),
                    body: r.text().await.unwrap(),
                    sent,
                    answered,
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in senders {
        answers.push(s.await.unwrap());
    }
    answers
}

/// Runs the rounds on two gateways over `database` and returns, per round, the process that
/// accepted the key.
async fn rounds(dir: &std::path::Path, database: &str) -> Vec<usize> {
    std::fs::write(dir.join("oncebox.toml"), CONFIG).unwrap();
    let nodes: [Node; 2] = [gateway(dir, database, &[]), gateway(dir, database, &[])];
    let urls = [nodes[0].url.clone(), nodes[1].url.clone()];
    let mut winners = Vec::new();
    // Requests to the other process sent before the winner's answer came: each had to learn of
    // the winner through the store while it was still at work.
    let mut contended = 0;
    for round in 0..ROUNDS {
        let answers = race(&urls, &format!("evt-{round}")).await;
        let odd: Vec<&Answer> = answers.iter().filter(|a| a.status != 202).collect();
        assert!(
            odd.is_empty(),
            "round {round}: answers other than 202: {odd:?}"
        );
        let first: Vec<&Answer> = answers.iter().filter(|a| !a.replayed).collect();
        assert_eq!(first.len(), 1, "round {round}: accepted as new: {first:?}");
        for a in &answers {
            assert_eq!(
                a.body, first[0].body,
                "round {round}: a replay differs: {a:?}"
            );
        }
        let winner = first[0];
        contended += answers
            .iter()
            .filter(|a| a.node != winner.node && a.sent < winner.answered)
            .count();
        winners.push(winner.node);
    }
    eprintln!("{contended} requests raced the winner from the other process");
    assert!(contended > 0, "the processes never raced each other");
    for node in nodes {
        node.stop();
    }
    winners
}

#[test]
fn one_key_raced_through_two_sqlite_processes_is_accepted_once() {
    run_within(Duration::from_secs(120), async {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("race.db");
        let database = format!("sqlite://{}", db.display());
        let winners = rounds(dir.path(), &database).await;
        let conn = oncebox_sqlite::rusqlite::Connection::open(&db).unwrap();
        let stored: i64 = conn
            .query_row(
                "SELECT count(*) FROM oncebox_inbox WHERE source = 'race'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(
            stored, ROUNDS as i64,
            "one event per key (winners {winners:?})"
        );
        eprintln!("sqlite: each of {ROUNDS} keys accepted once, by processes {winners:?}");
    });
}

#[test]
fn one_key_raced_through_two_postgres_processes_is_accepted_once() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    run_within(Duration::from_secs(120), async move {
        let schema = Schema::create(&base, "race").await;
        let dir = tempfile::tempdir().unwrap();
        let winners = rounds(dir.path(), &schema.url).await;
        let stored: i64 =
            oncebox_postgres::sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
                .fetch_one(&schema.pool().await)
                .await
                .unwrap();
        assert_eq!(
            stored, ROUNDS as i64,
            "one event per key (winners {winners:?})"
        );
        eprintln!("postgres: each of {ROUNDS} keys accepted once, by processes {winners:?}");
    });
}
