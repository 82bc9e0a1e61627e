//! The webhook authenticity table against `oncebox serve`: forged, truncated, over-long,
//! out-of-time and cross-source signatures, each answered as the table expects. Every answer is
//! in the history; the checker's U catches any effect a forged or foreign-signed request caused,
//! and any such request acknowledged.

use std::time::Duration;

use oncebox_core::{Clock, SystemClock, Timestamp};

use crate::hostile::{BANK, Req, SHOP, Stage, signed, tampered, with};
use crate::table::{Report, Scenario};
use crate::world::{self, block_on};

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
        // Timestamps: tolerance (300 s) + 1 s either way, far future, negative, i64::MIN, 30
        // digits. Each is signed as sent wherever milliseconds can hold it, so only the time can
        // refuse it: a signature over another time would be refused with any tolerance.
        for (i, at) in [
            now.0 / 1000 - 301,
            now.0 / 1000 + 301,
            now.0 / 1000 + 10_000_000,
            -5,
            i64::MIN,
        ]
        .iter()
        .enumerate()
        {
            let id = format!("ts{i}");
            let h = signed(
                SHOP,
                &id,
                Timestamp(at.saturating_mul(1000)),
                &body(&id, 10),
            );
            req(
                "shop",
                &id,
                with(h, "webhook-timestamp", &at.to_string()),
                &body(&id, 10),
                Some("forged"),
                false,
            );
        }
        // Within the tolerance either way, by a margin for the time the table takes to send:
        // accepted.
        for (i, at) in [now.0 / 1000 - 290, now.0 / 1000 + 290].iter().enumerate() {
            let id = format!("tsin{i}");
            let h = signed(SHOP, &id, Timestamp(at * 1000), &body(&id, 10));
            req("shop", &id, h, &body(&id, 10), Some("shop"), true);
        }
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
        for (r, ok) in table {
            let what = format!("{}/{}", r.source, r.id);
            let status = stage.send(&c, r).await;
            let passed = (200..300).contains(&status);
            refused += u64::from((400..500).contains(&status));
            if passed != ok || status >= 500 || status == 0 {
                wrong.push(format!("{what}: {status}"));
            }
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
