//! The harness checks itself on real runs: the same senders and checker as every scenario,
//! pointed at stand-in gateways broken on purpose (one that applies every delivery, one that
//! stores nothing, one that calls first deliveries replays, one that answers before its commit,
//! one that takes another payload for a stored key as a replay, one that takes any source's
//! credentials) and at one that is not broken. Each broken one must show up in its own figure
//! (D, L, F, P, C, U), and the sound one in none: a checker that misses a real double apply, or
//! flags a correct run, would make every other row of the table meaningless.
//!
//! A stand-in's "signature" is the name of the source whose secret signed the request, in an
//! `x-signed-by` header: enough to tell credentials apart, which is all the checker sees of
//! them. A request without one is unsigned, which the stand-ins' source accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use oncebox_testkit::checker::{Figures, Final, check};
use oncebox_testkit::history::{History, Key, Outcome, Refusal, key};

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
    /// Deduplicates by key alone: another payload for a stored key is answered as a replay
    /// of the first instead of refused as a conflict.
    MissesConflicts,
    /// Takes a request signed with any source's credentials.
    IgnoresCredentials,
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
    asked: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let (flaw, kept) = &*shared;
    let signer = asked.get("x-signed-by").and_then(|v| v.to_str().ok());
    if signer.is_some_and(|s| s != source) && *flaw != Flaw::IgnoresCredentials {
        return (StatusCode::UNAUTHORIZED, HeaderMap::new(), "{}");
    }
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let k = key(&source, &id);
    let tag = tag_of(body.as_bytes());
    let mut kept = kept.lock().unwrap();
    let first = kept.effects.get(&k).and_then(|e| e.first());
    if first.is_some_and(|f| *f != tag) && *flaw != Flaw::MissesConflicts {
        return (StatusCode::UNPROCESSABLE_ENTITY, HeaderMap::new(), "{}");
    }
    let seen = first.is_some();
    let apply = match flaw {
        Flaw::None
        | Flaw::FalseReplay
        | Flaw::AnswersBeforeCommit
        | Flaw::MissesConflicts
        | Flaw::IgnoresCredentials => !seen,
        Flaw::AppliesTwice => true,
        Flaw::Forgets => false,
    };
    if apply {
        let stamp = match flaw {
            Flaw::AnswersBeforeCommit => now_ms() + 1000,
            _ => now_ms(),
        };
        kept.effects.entry(k.clone()).or_default().push(tag);
        kept.records.entry(k).or_default().push(Some(stamp));
    }
    let replayed = match flaw {
        Flaw::FalseReplay => true,
        Flaw::None
        | Flaw::AnswersBeforeCommit
        | Flaw::MissesConflicts
        | Flaw::IgnoresCredentials => seen,
        Flaw::AppliesTwice | Flaw::Forgets => false,
    };
    let mut headers = HeaderMap::new();
    if replayed {
        headers.insert("idempotent-replayed", "true".parse().unwrap());
    }
    (StatusCode::ACCEPTED, headers, r#"{"status":"accepted"}"#)
}

/// Sends event `id` with payload `tag` to `source` at `base`, signed with the credentials of
/// source `signer`, recorded in `history`.
async fn deliver_signed(
    c: &reqwest::Client,
    history: &History,
    base: &str,
    (source, id, tag): (&str, &str, &str),
    signer: &str,
) {
    let op = history.invoke(key(source, id), tag, Some(signer));
    let sent = c
        .post(format!("{base}/v1/sources/{source}/events"))
        .header("content-type", "application/json")
        .header("x-signed-by", signer)
        .body(world::body(id, tag))
        .send()
        .await;
    match sent {
        Ok(r) => op.end(Outcome::http(
            r.status().as_u16(),
            r.headers().contains_key("idempotent-replayed"),
        )),
        Err(e) => op.info(e.to_string()),
    }
}

/// Sends five events twice each (a sender's retry), then another payload for each (five
/// conflicts injected), then five events signed with another source's credentials, to a
/// stand-in with `flaw`; the figures.
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
    for tag in ["v1", "v1", "v2"] {
        for i in 0..5 {
            world::deliver(&c, &history, &base, "standin", &format!("e{i}"), tag).await;
        }
    }
    for i in 0..5 {
        let id = format!("x{i}");
        deliver_signed(&c, &history, &base, ("standin", &id, "v1"), "other").await;
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
            sound.clean(0) && sound.conflicts() == "5/5",
            "a sound stand-in was flagged, or its refused conflicts not counted: {sound}"
        );
        let mut caught = Vec::new();
        let picks: [(Flaw, Pick, &str); 6] = [
            (Flaw::AppliesTwice, |f| &f.d, "D"),
            (Flaw::Forgets, |f| &f.l, "L"),
            (Flaw::FalseReplay, |f| &f.f, "F"),
            (Flaw::AnswersBeforeCommit, |f| &f.p, "P"),
            (Flaw::MissesConflicts, |f| &f.c, "C"),
            (Flaw::IgnoresCredentials, |f| &f.u, "U"),
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
                "{flaw:?} must show as {name} for every key: {figures}"
            );
            caught.push(format!("{flaw:?} {name} {n}"));
        }
        // The crash scenarios' audit check: a refusal whose conflict row is missing.
        let h = History::new();
        for id in ["c0", "c1"] {
            let op = h.invoke(key("standin", id), "v2", None);
            op.end(Outcome::Fail(Refusal::Conflict));
        }
        let mut lost = Figures::default();
        let rows = vec![(key("standin", "c1"), "v2".to_owned())];
        crate::conflicts::check(&mut lost, &h.ops(), rows);
        assert_eq!(
            lost.c.len(),
            1,
            "a lost conflict row must show as C: {lost}"
        );
        caught.push("LostConflictRow C 1".to_owned());
        Report {
            figures: sound,
            exercised: caught.len() as u64,
            what: format!("caught: {}", caught.join(", ")),
            expected_unresolved: 0,
        }
    })
}
