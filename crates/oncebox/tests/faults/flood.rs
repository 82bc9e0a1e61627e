//! Hostile senders that cost the gateway resources: slowloris connections (headers and body
//! trickled past the timeouts), a flood of one key and a flood of forged signatures.

use std::time::{Duration, Instant};

use oncebox_core::{Clock, SystemClock};
use oncebox_testkit::history::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hostile::{Req, Stage, tampered};
use crate::table::{Report, Scenario, scale};
use crate::world::{self, block_on};

pub const SLOWLORIS_AND_FLOODS: Scenario = Scenario {
    name: "hostile: slowloris and floods",
    backend: "sqlite",
    run: || Some(slowloris_and_floods()),
};

/// The stage's `header_timeout` and `body_timeout` (`hostile.rs`): no slow client may be cut
/// off sooner, or it was refused for something else.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Opens a connection, sends `at_once` whole, then trickles `trickled` a byte every 100 ms;
/// returns how long the server let it live (it must cut it off) and what it answered, or
/// `None` if it outlived `limit`.
async fn slow(
    addr: &str,
    at_once: &str,
    trickled: &str,
    limit: Duration,
) -> Option<(Duration, String)> {
    // Started before connecting: the server's timeout runs from its accept, which cannot come
    // earlier, while this task may resume from `connect` a few ms after that accept (once
    // measured from after `connect`: cut off at 998.99 ms of a 1 s timeout).
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(at_once.as_bytes()).await.ok()?;
    let mut buf = [0u8; 256];
    for b in trickled.bytes().cycle() {
        if start.elapsed() > limit {
            return None;
        }
        tokio::select! {
            r = s.read(&mut buf) => {
                // A close, or an answer that must be the timeout's 408: anything else (a 400
                // for the trickled bytes, say) would not be the timeout firing.
                let n = r.unwrap_or(0);
                let mut answer = buf[..n].to_vec();
                // The rest of the answer, up to the close that follows it.
                if n > 0 {
                    let rest = s.read_to_end(&mut answer);
                    let _ = tokio::time::timeout(Duration::from_secs(5), rest).await;
                }
                let answer = String::from_utf8_lossy(&answer).into_owned();
                assert!(
                    n == 0 || answer.starts_with("HTTP/1.1 408"),
                    "a slow client was answered {answer:?}"
                );
                return Some((start.elapsed(), answer));
            }
            // The trickle itself is the fault: one byte every 100 ms.
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if s.write_all(&[b]).await.is_err() {
            return Some((start.elapsed(), String::new()));
        }
    }
    None
}

fn slowloris_and_floods() -> Report {
    let stage = Stage::start();
    block_on(Duration::from_secs(90), async {
        let addr = stage.base.trim_start_matches("http://").to_owned();
        let head = "POST /v1/sources/open/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let full =
            "POST /v1/sources/open/events HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n";
        let limit = Duration::from_secs(8);
        let slow_clients: Vec<_> = (0..8)
            .map(|i| {
                let addr = addr.clone();
                // Four trickle their headers; four send their headers whole and trickle the
                // body, which only the body timeout can end.
                let (at_once, trickled) = if i < 4 {
                    ("", head)
                } else {
                    (full, "{\"id\":\"slow\",\"p\":\"")
                };
                tokio::spawn(async move { slow(&addr, at_once, trickled, limit).await })
            })
            .collect();
        let mut cut = Vec::new();
        for t in slow_clients {
            cut.push(t.await.unwrap());
        }
        assert!(
            cut.iter().all(Option::is_some),
            "a slow client outlived the timeouts: {cut:?}"
        );
        assert!(
            cut.iter().flatten().all(|(d, _)| *d >= TIMEOUT),
            "a slow client was cut off before the timeout: {cut:?}"
        );
        // The bodies were cut by the body timeout, which says so.
        for (_, answer) in cut.iter().flatten().skip(4) {
            assert!(
                answer.contains("body-timeout"),
                "a slow body ended with {answer:?}"
            );
        }
        // A flood of one key: one record, every other answer a replay.
        let c = world::client();
        let flood = scale(300);
        let tasks: Vec<_> = (0..flood)
            .map(|_| {
                let (c, stage_history, base) =
                    (c.clone(), stage.history.clone(), stage.base.clone());
                tokio::spawn(async move {
                    world::deliver(&c, &stage_history, &base, "open", "one-key", "flood").await
                })
            })
            .collect();
        let mut fresh = 0;
        for t in tasks {
            let o = t.await.unwrap();
            assert!(matches!(o, Outcome::Ok { .. }), "flood answer {o:?}");
            fresh += usize::from(o == Outcome::Ok { replayed: false });
        }
        assert_eq!(fresh, 1, "one delivery of the flood applied");
        stage
            .tags
            .lock()
            .unwrap()
            .insert(world::body("one-key", "flood").into_bytes(), "flood".into());
        // A flood of forged signatures: all refused, nothing stored.
        let now = SystemClock.now();
        let mut forged_refused = 0;
        for i in 0..flood {
            let id = format!("forged{i}");
            let b = format!(r#"{{"id":"{id}"}}"#);
            let h = tampered(&id, now, &b, |s| format!("{}A", &s[..s.len() - 1]));
            let r = Req {
                source: "shop",
                id,
                headers: h,
                body: b.into_bytes(),
                credentials: Some("forged"),
                tag: format!("f{i}"),
            };
            forged_refused += usize::from(stage.send(&c, r).await == 401);
        }
        assert_eq!(forged_refused, flood, "every forged request refused 401");
        let cuts = cut.len() as u64;
        Report {
            figures: stage.finish(),
            exercised: cuts * (flood as u64),
            what: format!(
                "{cuts} slow clients cut off (4 by the header timeout, 4 by the body timeout; \
                 slowest {:?}), {flood} same-key and {flood} forged requests",
                cut.iter()
                    .flatten()
                    .map(|(d, _)| *d)
                    .max()
                    .unwrap_or_default()
            ),
            expected_unresolved: 0,
        }
    })
}
