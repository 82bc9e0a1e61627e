//! The webhook authenticity table against `oncebox serve`: forged, truncated, over-long,
//! out-of-time and cross-source signatures, each answered as the table expects. Every answer is
//! in the history; the checker's U catches any effect a forged or foreign-signed request caused,
//! and any such request acknowledged.

use std::time::Duration;

use oncebox_core::{Clock, SystemClock, Timestamp};

use crate::hostile::{BANK, Req, SHOP, Stage, signed, tampered, with};
use crate::table::{Report, Scenario};
use crate::world::{self, block_on};

/// A timestamp case: its event id, the signed time from the second it is sent in, and whether
/// the gateway must take it.
type Case = (&'static str, fn(i64) -> i64, bool);

pub const AUTHENTICITY: Scenario = Scenario {
    name: "hostile: webhook authenticity table",
    backend: "sqlite",
    run: || Some(authenticity()),
};

fn authenticity() -> Report {
    let stage = Stage::start();
    block_on(Duration::from_secs(60), async {
        let c = world::client();
        let now = SystemClock.now();
        let mut table: Vec<(Req, bool)> = Vec::new();
        let mut req = |source, id: &str, headers, body: &str, credentials, ok| {
            table.push((
                Req {
                    source,
                    id: id.to_owned(),
                    headers,
                    body: body.as_bytes().to_vec(),
                    credentials,
                    // Named by the body: a repeat of one body is one payload.
                    tag: body.to_owned(),
                },
                ok,
            ));
        };
        let body = |id: &str, n: u32| format!(r#"{{"id":"{id}","n":{n}}}"#);
        let valid = signed(SHOP, "a1", now, &body("a1", 1));
        req(
            "shop",
            "a1",
            valid.clone(),
            &body("a1", 1),
            Some("shop"),
            true,
        );
        // The same delivery again: a replay, still authenticated.
        req(
            "shop",
            "a1",
            valid.clone(),
            &body("a1", 1),
            Some("shop"),
            true,
        );
        req(
            "bank",
            "b1",
            signed(BANK, "b1", now, &body("b1", 1)),
            &body("b1", 1),
            Some("bank"),
            true,
        );
        // Shop's secret never works for bank.
        req(
            "bank",
            "a2",
            signed(SHOP, "a2", now, &body("a2", 2)),
            &body("a2", 2),
            Some("shop"),
            false,
        );
        // One changed byte of body, id or timestamp.
        req(
            "shop",
            "a3",
            signed(SHOP, "a3", now, &body("a3", 3)),
            &body("a3", 4),
            Some("forged"),
            false,
        );
        req(
            "shop",
            "a4x",
            with(signed(SHOP, "a4", now, &body("a4", 5)), "webhook-id", "a4x"),
            &body("a4", 5),
            Some("forged"),
            false,
        );
        let ts = (now.0 / 1000 + 1).to_string();
        req(
            "shop",
            "a5",
            with(
                signed(SHOP, "a5", now, &body("a5", 6)),
                "webhook-timestamp",
                &ts,
            ),
            &body("a5", 6),
            Some("forged"),
            false,
        );
        // Every prefix of a valid signature, empty and `v1,` included; over-long; bad base64.
        let full = valid
            .iter()
            .find(|(n, _)| n == "webhook-signature")
            .unwrap()
            .1
            .len();
        for cut in 0..full {
            let (id, b) = (format!("p{cut}"), body(&format!("p{cut}"), 0));
            req(
                "shop",
                &id,
                tampered(&id, now, &b, |s| s[..cut].to_owned()),
                &b,
                Some("forged"),
                false,
            );
        }
        let long = |s: &str| format!("{s}{}", "A".repeat(8000));
        req(
            "shop",
            "long",
            tampered("long", now, &body("long", 7), long),
            &body("long", 7),
            Some("forged"),
            false,
        );
        let bad = |_: &str| "v1,!!!not*base64".to_owned();
        req(
            "shop",
            "b64",
            tampered("b64", now, &body("b64", 8), bad),
            &body("b64", 8),
            Some("forged"),
            false,
        );
        // One valid entry among several passes; a thousand junk entries do not.
        let good = signed(SHOP, "rot1", now, &body("rot1", 9));
        let good_sig = good
            .iter()
            .find(|(n, _)| n == "webhook-signature")
            .unwrap()
            .1
            .clone();
        let junk = vec!["v1,c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJlc2lnbmE="; 1000].join(" ");
        let few = ["v1,c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJlc2lnbmE="; 5].join(" ");
        req(
            "shop",
            "rot1",
            with(
                good.clone(),
                "webhook-signature",
                &format!("{few} {good_sig}"),
            ),
            &body("rot1", 9),
            Some("shop"),
            true,
        );
        let only_junk = |_: &str| junk.clone();
        req(
            "shop",
            "rot2",
            tampered("rot2", now, &body("rot2", 9), only_junk),
            &body("rot2", 9),
            Some("forged"),
            false,
        );
        let h = signed(SHOP, "ts30", now, &body("ts30", 11));
        req(
            "shop",
            "ts30",
            with(h, "webhook-timestamp", &"9".repeat(30)),
            &body("ts30", 11),
            Some("forged"),
            false,
        );
        let mut refused = 0u64;
        let mut wrong = Vec::new();
        let mut judge = |what: String, status: u16, ok: bool| {
            let passed = (200..300).contains(&status);
            refused += u64::from((400..500).contains(&status));
            if passed != ok || status >= 500 || status == 0 {
                wrong.push(format!("{what}: {status}"));
            }
        };
        for (r, ok) in table {
            let what = format!("{}/{}", r.source, r.id);
            judge(what, stage.send(&c, r).await, ok);
        }
        // Timestamps, each signed as it is sent (the gateway compares whole seconds with its
        // clock then, so a time taken before the rest of the table was sent drifts into the
        // tolerance): past the tolerance (300 s) by 1 s behind and 2 s ahead (ahead, a second
        // turning between signing and checking would take 1 s off), far future, negative,
        // i64::MIN; within it by 290 s and by 298 s either way (2 s short of the tolerance, so
        // a second or two turning on a slow machine cannot carry it past; a tolerance shorter
        // than 298 s is refused). Each is signed as sent wherever
        // milliseconds can hold it, so only the time can refuse it: a signature over another
        // time would be refused with any tolerance.
        let cases: [Case; 9] = [
            ("ts0", |s| s - 301, false),
            ("ts1", |s| s + 302, false),
            ("ts2", |s| s + 10_000_000, false),
            ("ts3", |_| -5, false),
            ("ts4", |_| i64::MIN, false),
            ("tsin0", |s| s - 290, true),
            ("tsin1", |s| s + 290, true),
            ("tsin2", |s| s - 298, true),
            ("tsin3", |s| s + 298, true),
        ];
        for (id, at, ok) in cases {
            let at = at(SystemClock.now().0 / 1000);
            let text = body(id, 10);
            let h = signed(SHOP, id, Timestamp(at.saturating_mul(1000)), &text);
            let r = Req {
                source: "shop",
                id: id.to_owned(),
                headers: with(h, "webhook-timestamp", &at.to_string()),
                body: text.as_bytes().to_vec(),
                credentials: Some(if ok { "shop" } else { "forged" }),
                tag: text.clone(),
            };
            judge(format!("shop/{id}"), stage.send(&c, r).await, ok);
        }
        assert!(wrong.is_empty(), "answers against the table: {wrong:?}");
        Report {
            figures: stage.finish(),
            exercised: refused,
            what: format!("{refused} forged or foreign requests refused"),
            expected_unresolved: 0,
        }
    })
}
