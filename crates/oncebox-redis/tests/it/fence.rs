//! A holder paused past its TTL: the lease really expires in Redis, another worker takes over
//! with a higher token, and everything the first holder tries afterwards is refused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use oncebox_core::{Begun, LeaseError, Response};
use oncebox_testkit::run;

use crate::harness::{Namespace, event, query, raw, report, shared, wait_until};
use crate::lease::leased;

const KEYS: usize = 10;
const SHORT: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(30);

/// A receiver that checks fencing tokens, as the crate docs ask of one that must refuse a
/// paused holder: per key, an effect with a token below the highest seen is refused.
#[derive(Debug, Default)]
struct FencedReceiver {
    seen: Mutex<HashMap<String, (i64, usize)>>,
}

impl FencedReceiver {
    fn apply(&self, key: &str, token: i64) -> bool {
        let mut seen = self.seen.lock().unwrap();
        let entry = seen.entry(key.to_owned()).or_insert((i64::MIN, 0));
        if token < entry.0 {
            return false;
        }
        *entry = (token, entry.1 + 1);
        true
    }

    fn effects(&self, key: &str) -> usize {
        self.seen.lock().unwrap().get(key).map_or(0, |e| e.1)
    }
}

#[test]
fn holder_paused_past_its_ttl_is_fenced_by_a_higher_token() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let (first, second) = (ns.leases().await, ns.leases().await);
        let conn = raw(&url).await;
        let receiver = FencedReceiver::default();
        let events: Vec<_> = (0..KEYS).map(|i| event(&format!("slow-{i}"), 1)).collect();

        // The first holder takes every key with a short TTL, then "pauses": it does nothing
        // until Redis has really expired all its leases.
        let mut paused = Vec::new();
        for e in &events {
            paused.push(leased(first.begin(e, SHORT).await));
        }
        let records: Vec<String> = events.iter().map(|e| ns.record(&e.key)).collect();
        wait_until(
            "the first holder's leases expire",
            Duration::from_secs(10),
            || {
                let mut conn = conn.clone();
                let records = records.clone();
                async move {
                    let args: Vec<&str> = records.iter().map(String::as_str).collect();
                    let left: i64 = query(&mut conn, "EXISTS", &args).await;
                    left == 0
                }
            },
        )
        .await;
        // Every record is gone (the wait above fails the test otherwise): the fault happened.
        // The holder's estimate against Redis's own end is the next test's.

        // The second worker takes the keys anew (Redis forgot the first holder, so it is no
        // takeover it can tell) with higher tokens and performs the effect.
        let (mut higher, mut false_duplicates) = (0, 0);
        let mut taken = Vec::new();
        for (e, old) in events.iter().zip(&paused) {
            let lease = match second.begin(e, LONG).await {
                Ok(Begun::Leased(lease)) => lease,
                Ok(Begun::Duplicate(_)) => {
                    false_duplicates += 1; // nobody completed this key
                    continue;
                }
                other => panic!("takeover refused: {other:?}"),
            };
            assert!(!lease.taken_over, "the first holder's record was gone");
            if lease.token > old.token {
                higher += 1;
            }
            assert!(receiver.apply(&e.key.to_string(), lease.token));
            taken.push(lease);
        }

        // The first holder wakes up and carries on as if nothing happened, while the second
        // still holds the keys: the records are `processing` as its were, and only the token
        // tells the two holders apart.
        let mut fenced = 0;
        for (e, old) in events.iter().zip(&paused) {
            let refused_there = !receiver.apply(&e.key.to_string(), old.token);
            let late = Response::completed("first");
            let refused_here = first.complete(old, &late).await == Err(LeaseError::Fenced)
                && first.release(old).await == Err(LeaseError::Fenced)
                && first.uncertain(old).await == Err(LeaseError::Fenced);
            if refused_there && refused_here {
                fenced += 1;
            }
        }
        for lease in &taken {
            second
                .complete(lease, &Response::completed("second"))
                .await
                .expect("the second holder's lease was untouched");
        }

        // Every key replays the second holder's answer; the first's never got in.
        let mut lost = 0;
        for e in &events {
            match first.begin(e, LONG).await {
                Ok(Begun::Duplicate(r)) if r == Response::completed("second") => {}
                _ => lost += 1,
            }
        }
        let mut doubles = 0;
        for e in &events {
            match receiver.effects(&e.key.to_string()) {
                0 => lost += 1,
                1 => {}
                _ => doubles += 1,
            }
        }
        report(
            "fence",
            doubles,
            lost,
            false_duplicates,
            &format!("keys={KEYS} expired={KEYS} higher_token={higher} fenced={fenced}"),
        );
        assert_eq!((higher, fenced), (KEYS, KEYS));
    });
}

/// Between a lease's end and its record's expiry the record still names its holder, and only
/// Redis's clock against the lease's `until` refuses a late completion: the holder's own
/// estimate of its end is never later, and a contender then takes the key over and says so.
#[test]
fn a_holder_past_its_lease_is_fenced_by_redis_clock_before_anyone_takes_over() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let (first, second) = (ns.leases().await, ns.leases().await);
        let mut conn = raw(&url).await;
        let e = event("window", 1);
        // A lease of a second, so that a stall before the record is kept longer (below) cannot
        // let it vanish first.
        let lease = leased(first.begin(&e, Duration::from_secs(1)).await);
        let record = ns.record(&e.key);
        // The record outlives the lease by a minute here, so that nothing but `until` can
        // refuse the holder.
        let _: i64 = query(&mut conn, "PEXPIRE", &[&record, "60000"]).await;
        let until: i64 = query(&mut conn, "HGET", &[&record, "until"]).await;
        assert!(
            lease.expires_at.0 <= until,
            "the holder's estimate {} is later than Redis's end {until}",
            lease.expires_at.0
        );
        wait_until(
            "Redis's clock passes the lease's end",
            Duration::from_secs(10),
            || {
                let mut conn = conn.clone();
                async move { crate::harness::redis_now(&mut conn).await >= until }
            },
        )
        .await;
        assert_eq!(
            first.complete(&lease, &Response::completed("late")).await,
            Err(LeaseError::Fenced)
        );
        let (state, token): (String, String) =
            query(&mut conn, "HMGET", &[&record, "state", "token"]).await;
        assert_eq!(
            (state.as_str(), token),
            ("processing", lease.token.to_string())
        );

        let Ok(Begun::Leased(taken)) = second.begin(&e, LONG).await else {
            panic!("an ended lease is taken over");
        };
        assert!(taken.taken_over && taken.token > lease.token);
        assert_eq!(
            first.uncertain(&lease).await,
            Err(LeaseError::Fenced),
            "once taken over, the first holder parks nothing"
        );
        second
            .complete(&taken, &Response::completed("second"))
            .await
            .unwrap();
    });
}
