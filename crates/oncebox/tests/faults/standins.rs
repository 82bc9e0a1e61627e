//! The harness checks itself on real runs: the same senders and checker as every scenario,
//! pointed at stand-in gateways broken on purpose (one that applies every delivery, one that
//! stores nothing, one that calls first deliveries replays, one that answers before its commit)
//! and at one that is not broken. Each broken one must show up in its own figure, and the sound
//! one in none: a checker that misses a real double apply, or flags a correct run, would make
//! every other row of the table meaningless.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use oncebox_testkit::checker::{Figures, Final, check};
use oncebox_testkit::history::{History, Key, key};

use crate::table::{Report, Scenario};
use crate::world::{self, block_on, tag_of};

pub const BROKEN_STANDINS: Scenario = Scenario {
    name: "harness: broken stand-ins caught",
    backend: "none",
    run: || Some(standins()),
};

/// How a stand-in is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Deduplicates and replays as a gateway should.
    None,
    /// Applies every delivery, retries included.
    AppliesTwice,
    /// Acknowledges and keeps nothing.
    Forgets,
    /// Answers a first delivery as a replay.
    FalseReplay,
    /// Acknowledges first and commits a second later.
    AnswersBeforeCommit,
}

/// What a stand-in applied and committed, as the checker reads a store.
#[derive(Default)]
struct Kept {
    effects: BTreeMap<Key, Vec<String>>,
    records: BTreeMap<Key, Vec<Option<i64>>>,
}

type Shared = Arc<(Flaw, Mutex<Kept>)>;

/// One figure's findings.
type Pick = fn(&Figures) -> &Vec<String>;

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

async fn receive(
    State(shared): State<Shared>,
    Path(source): Path<String>,
    body: String,
) -> impl IntoResponse {
    let (flaw, kept) = &*shared;
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let k = key(&source, &id);
    let mut kept = kept.lock().unwrap();
    let seen = kept.effects.contains_key(&k);
    let apply = match flaw {
        Flaw::None | Flaw::FalseReplay | Flaw::AnswersBeforeCommit => !seen,
        Flaw::AppliesTwice => true,
        Flaw::Forgets => false,
    };
    if apply {
        let stamp = match flaw {
            Flaw::AnswersBeforeCommit => now_ms() + 1000,
            _ => now_ms(),
        };
        kept.effects
            .entry(k.clone())
            .or_default()
            .push(tag_of(body.as_bytes()));
        kept.records.entry(k).or_default().push(Some(stamp));
    }
    let replayed = match flaw {
        Flaw::FalseReplay => true,
        Flaw::None | Flaw::AnswersBeforeCommit => seen,
        Flaw::AppliesTwice | Flaw::Forgets => false,
    };
    let mut headers = HeaderMap::new();
    if replayed {
        headers.insert("idempotent-replayed", "true".parse().unwrap());
    }
    (StatusCode::ACCEPTED, headers, r#"{"status":"accepted"}"#)
}

/// Sends five events twice each (a sender's retry) to a stand-in with `flaw`; the figures.
async fn run(flaw: Flaw) -> Figures {
    let shared: Shared = Arc::new((flaw, Mutex::new(Kept::default())));
    let app = Router::new()
        .route("/v1/sources/{source}/events", post(receive))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let history = History::new();
    let c = world::client();
    for _ in 0..2 {
        for i in 0..5 {
            world::deliver(&c, &history, &base, "standin", &format!("e{i}"), "v1").await;
        }
    }
    server.abort();
    let kept = std::mem::take(&mut *shared.1.lock().unwrap());
    let fin = Final {
        effects: kept.effects,
        records: kept.records,
        unresolved: Vec::new(),
    };
    check(&history.ops(), &fin)
}

fn standins() -> Report {
    block_on(Duration::from_secs(60), async {
        let sound = run(Flaw::None).await;
        assert!(
            [&sound.d, &sound.l, &sound.f, &sound.p, &sound.c, &sound.u]
                .iter()
                .all(|v| v.is_empty()),
            "a sound stand-in was flagged: {sound:?}"
        );
        let mut caught = Vec::new();
        let picks: [(Flaw, Pick, &str); 4] = [
            (Flaw::AppliesTwice, |f| &f.d, "D"),
            (Flaw::Forgets, |f| &f.l, "L"),
            (Flaw::FalseReplay, |f| &f.f, "F"),
            (Flaw::AnswersBeforeCommit, |f| &f.p, "P"),
        ];
        for (flaw, figure, name) in picks {
            let figures = run(flaw).await;
            // Findings name their key first (`standin/e0: …`); a key may be named twice.
            let keys: BTreeSet<&str> = figure(&figures)
                .iter()
                .filter_map(|finding| finding.split(':').next())
                .collect();
            let n = keys.len();
            assert_eq!(
                n, 5,
                "{flaw:?} must show as {name} for every key: {figures:?}"
            );
            caught.push(format!("{flaw:?} {name} {n}"));
        }
        Report {
            figures: sound,
            exercised: caught.len() as u64,
            what: format!("caught: {}", caught.join(", ")),
            expected_u: 0,
        }
    })
}
