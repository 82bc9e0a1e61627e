//! Hostile senders against `oncebox serve`: the stage every hostile table shares (a gateway
//! on a fresh SQLite file whose sources sign with Standard Webhooks, its history and the
//! checker's final state), signing helpers, and the bad-input table (oversized, malformed and
//! ambiguous bodies, bad and look-alike ids). Every answer is in the history; the checker's F
//! catches any look-alike id answered as a replay, C a conflicting payload acknowledged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::Timestamp;
use oncebox_core::signature::{Scheme, Secret, sign};
use oncebox_testkit::checker::{Final, check};
use oncebox_testkit::history::{History, Outcome, key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::table::{Report, Scenario};
use crate::world::{self, block_on, final_sqlite};

pub const BAD_INPUT: Scenario = Scenario {
    name: "hostile: bad input table",
    backend: "sqlite",
    run: || Some(bad_input()),
};

pub const SHOP: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const BANK: &str = "whsec_QmFua1NlY3JldEZvckJhbmtUZXN0czEyMzQ=";

const CONFIG: &str = r#"
[limits]
header_timeout = "1s"
body_timeout = "1s"
[sources.shop]
signature = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
event_id = { header = "webhook-id" }
[sources.bank]
signature = "standard-webhooks"
secrets = ["whsec_QmFua1NlY3JldEZvckJhbmtUZXN0czEyMzQ="]
event_id = { header = "webhook-id" }
[sources.open]
signature = "none"
event_id = { pointer = "/id" }
"#;

/// A request a hostile table sends: headers and body, raw.
pub struct Req {
    pub source: &'static str,
    pub id: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whose secret signed it: `Some("forged")` for anything tampered with.
    pub credentials: Option<&'static str>,
    pub tag: String,
}

/// A gateway on a fresh SQLite file with [`CONFIG`], and what the scenario sent.
pub struct Stage {
    pub dir: tempfile::TempDir,
    pub server: oncebox_testkit::child::Proc,
    pub base: String,
    pub history: Arc<History>,
    /// Body sent → its tag, to name stored payloads.
    pub tags: Mutex<HashMap<Vec<u8>, String>>,
}

impl Stage {
    pub fn start() -> Stage {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
        let database = format!("sqlite://{}", dir.path().join("hostile.db").display());
        let server = world::serve(dir.path(), &database, "127.0.0.1:0", &[]).start();
        let base = world::url(&server);
        Stage {
            dir,
            server,
            base,
            history: Arc::new(History::new()),
            tags: Mutex::default(),
        }
    }

    pub async fn send(&self, c: &reqwest::Client, r: Req) -> u16 {
        self.tags
            .lock()
            .unwrap()
            .insert(r.body.clone(), r.tag.clone());
        let op = self
            .history
            .invoke(key(r.source, &r.id), &r.tag, r.credentials);
        let mut req = c
            .post(format!("{}/v1/sources/{}/events", self.base, r.source))
            .header("content-type", "application/json")
            .body(r.body);
        for (name, value) in &r.headers {
            req = req.header(name, value);
        }
        match req.send().await {
            Ok(a) => {
                let status = a.status().as_u16();
                op.end(Outcome::http(
                    status,
                    a.headers().contains_key("idempotent-replayed"),
                ));
                status
            }
            Err(e) => {
                op.info(e.to_string());
                0
            }
        }
    }

    /// Stops the gateway and checks: the final effects are named by the tags sent.
    pub fn finish(mut self) -> oncebox_testkit::checker::Figures {
        self.server.terminate();
        let mut fin: Final = final_sqlite(&self.dir.path().join("hostile.db"), false);
        let tags = self.tags.lock().unwrap();
        let c =
            oncebox_sqlite::rusqlite::Connection::open(self.dir.path().join("hostile.db")).unwrap();
        let mut s = c
            .prepare("SELECT source, event_id, payload FROM oncebox_inbox")
            .unwrap();
        let stored: Vec<(String, String, Vec<u8>)> = s
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for (source, id, payload) in stored {
            let tag = tags
                .get(&payload)
                .cloned()
                .unwrap_or_else(|| "never sent".into());
            fin.effects.insert(key(&source, &id), vec![tag]);
        }
        check(&self.history.ops(), &fin)
    }
}

/// Standard Webhooks headers for `body` signed with `secret`.
pub fn signed(secret: &str, id: &str, at: Timestamp, body: &str) -> Vec<(String, String)> {
    let s = Secret::parse(&Scheme::StandardWebhooks, secret).expect("secret");
    sign(&Scheme::StandardWebhooks, &s, id, at, body.as_bytes())
}

/// A validly signed shop request for `id` whose signature is then replaced by what `tamper`
/// makes of it.
pub fn tampered(
    id: &str,
    now: Timestamp,
    body: &str,
    tamper: impl Fn(&str) -> String,
) -> Vec<(String, String)> {
    let h = signed(SHOP, id, now, body);
    let sig = h
        .iter()
        .find(|(n, _)| n == "webhook-signature")
        .unwrap()
        .1
        .clone();
    with(h, "webhook-signature", &tamper(&sig))
}

/// Replaces `name`'s value in `headers`.
pub fn with(mut headers: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
    headers.retain(|(n, _)| n != name);
    headers.push((name.to_owned(), value.to_owned()));
    headers
}

/// Open-source requests with a raw body; `tag` names the payload for the checker.
fn open(id: &str, body: impl Into<Vec<u8>>, tag: &str) -> Req {
    Req {
        source: "open",
        id: id.to_owned(),
        headers: Vec::new(),
        body: body.into(),
        credentials: None,
        tag: tag.to_owned(),
    }
}

fn bad_input() -> Report {
    let stage = Stage::start();
    block_on(Duration::from_secs(60), async {
        // A connection per request: the gateway answers an oversize body before reading it and
        // then closes that connection, and a pooled client may already have sent the next row
        // on it (no answer, through no fault of the gateway's).
        let c = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .pool_max_idle_per_host(0)
            .build()
            .expect("http client");
        // (request, expected: Some(true) acknowledged fresh, Some(false) refused 4xx, None replay)
        let mut table: Vec<(Req, Option<bool>)> = vec![
            (
                open(
                    "big",
                    format!(r#"{{"id":"big","p":"{}"}}"#, "x".repeat(2 << 20)),
                    "big",
                ),
                Some(false),
            ),
            (
                open(
                    "utf8",
                    b"{\"id\":\"utf8\",\"p\":\"\xff\xfe\"}".to_vec(),
                    "utf8",
                ),
                Some(false),
            ),
            (
                open(
                    "deep",
                    format!(
                        r#"{{"id":"deep","p":{}{}}}"#,
                        "[".repeat(100_000),
                        "]".repeat(100_000)
                    ),
                    "deep",
                ),
                Some(false),
            ),
            (
                open("dup", r#"{"id":"dup","a":1,"a":2}"#, "dup"),
                Some(false),
            ),
            (
                open("sur", r#"{"id":"sur","a":"\ud800"}"#, "sur"),
                Some(false),
            ),
            (
                open("nul", b"{\"id\":\"nul\",\"a\":\"\0\"}".to_vec(), "nul"),
                Some(false),
            ),
            (
                open("trunc", r#"{"id":"trunc","a":[1,2"#, "trunc"),
                Some(false),
            ),
            (open("", r#"{"id":""}"#, "empty-id"), Some(false)),
            (open(" ", r#"{"id":" "}"#, "space-id"), Some(false)),
            (
                open("a\u{1}b", r#"{"id":"a\u0001b"}"#, "ctl-id"),
                Some(false),
            ),
            (
                open(
                    &"i".repeat(256),
                    format!(r#"{{"id":"{}"}}"#, "i".repeat(256)),
                    "long-id",
                ),
                Some(false),
            ),
        ];
        // Look-alikes are distinct keys: each is new, none a replay of another.
        for (n, id) in [
            "caf\u{e9}",
            "cafe\u{301}",
            "Evt",
            "evt",
            "\u{ff45}\u{ff56}\u{ff54}",
        ]
        .iter()
        .enumerate()
        {
            table.push((
                open(id, format!(r#"{{"id":"{id}"}}"#), &format!("look{n}")),
                Some(true),
            ));
        }
        // 1 = 1.0 = 1e0: one key, one payload; 2^53 + 1 ≠ 2^53: a conflict.
        table.push((open("num", r#"{"id":"num","n":1}"#, "one"), Some(true)));
        table.push((open("num", r#"{"id":"num","n":1.0}"#, "one"), None));
        table.push((open("num", r#"{"id":"num","n":1e0}"#, "one"), None));
        table.push((
            open("exact", r#"{"id":"exact","n":9007199254740993}"#, "odd"),
            Some(true),
        ));
        table.push((
            open("exact", r#"{"id":"exact","n":9007199254740992}"#, "even"),
            Some(false),
        ));
        let mut refused = 0u64;
        let mut wrong = Vec::new();
        for (r, expected) in table {
            let what = format!("{:?} {}", r.id.chars().take(12).collect::<String>(), r.tag);
            let status = stage.send(&c, r).await;
            refused += u64::from((400..500).contains(&status));
            let fine = match expected {
                Some(true) | None => (200..300).contains(&status),
                Some(false) => (400..500).contains(&status),
            };
            if !fine {
                wrong.push(format!("{what}: {status}"));
            }
        }
        // Over the limit without a Content-Length: refused before it is all read.
        let chunked = chunked_oversize(stage.base.trim_start_matches("http://"), 3 << 20).await;
        if !chunked.starts_with("HTTP/1.1 413") {
            wrong.push(format!("chunked oversize: {chunked:?}"));
        }
        refused += 1;
        assert!(wrong.is_empty(), "answers against the table: {wrong:?}");
        Report {
            figures: stage.finish(),
            exercised: refused,
            what: format!("{refused} bad inputs refused"),
            expected_unresolved: 0,
        }
    })
}

/// Sends a chunked body of up to `len` bytes (no Content-Length) in 64 KiB chunks, reading
/// the answer as soon as one comes; returns the answer's first line.
async fn chunked_oversize(addr: &str, len: usize) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = "POST /v1/sources/open/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    s.write_all(head.as_bytes()).await.expect("head");
    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, " ".repeat(64 << 10));
    let (mut read, mut write) = s.into_split();
    let sender = tokio::spawn(async move {
        for _ in 0..len / (64 << 10) {
            if write.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = write.write_all(b"0\r\n\r\n").await;
    });
    let mut answer = vec![0u8; 512];
    let n = read.read(&mut answer).await.unwrap_or(0);
    sender.abort();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}
