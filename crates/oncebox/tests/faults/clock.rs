//! Retention and clock jumps on the library with an injected clock (the binary's clock is the
//! system's): a retry just inside retention is still a replay, a purge at a clock that jumped
//! forward by less than the retention deletes nothing, a jump back deletes nothing, and a purge
//! past retention deletes only what is old enough.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Clock, Event, Key, ManualClock, Processed, Response, Retention};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::checker::check;
use oncebox_testkit::history::{History, Outcome, key};

use crate::table::{Report, Scenario};
use crate::world::{block_on, final_sqlite};

pub const RETENTION_AND_CLOCK_JUMPS_SQLITE: Scenario = Scenario {
    name: "clock: retention and clock jumps",
    backend: "sqlite",
    run: || Some(retention()),
};

const RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

fn retention() -> Report {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(oncebox_testkit::EPOCH));
    let inbox =
        Inbox::open(Options::new(dir.path().join("clock.db")).clock(clock.clone())).unwrap();
    let history = History::new();
    let policy = Retention::new(RETAIN);
    block_on(Duration::from_secs(60), async {
        let deliver = async |id: &str| {
            let op = history.invoke(key("clk", id), "v1", None);
            let event = Event::json(Key::parse("clk", id).unwrap(), r#"{"v":"v1"}"#).unwrap();
            match inbox
                .process(event, |_| Ok(Response::completed("ok")))
                .await
            {
                Ok(Processed::Duplicate(_)) => op.ok(true),
                Ok(_) => op.ok(false),
                Err(e) => op.info(e.to_string()),
            }
        };
        deliver("old").await;
        let start = clock.now();
        // Retention − 1 s later: still there, still a replay.
        clock.advance(RETAIN - Duration::from_secs(1));
        deliver("young").await;
        let mut purged = inbox.purge(clock.now(), &policy).await.unwrap();
        deliver("old").await;
        // The clock jumps back to the first delivery: nothing becomes old by it.
        clock.set(start);
        purged += inbox.purge(clock.now(), &policy).await.unwrap();
        assert_eq!(purged, 0, "nothing purged inside the window");
        // Back to the present, then two real seconds pass: past the retention of `old` only. (A
        // jump straight past it would purge nothing: a purge's now follows real time.)
        clock.set(start.plus(RETAIN - Duration::from_secs(1)));
        clock.advance(Duration::from_secs(2));
        let past = inbox.purge(clock.now(), &policy).await.unwrap();
        assert_eq!(past, 1, "only the record past its retention is purged");
        let young = inbox
            .record(&Key::parse("clk", "young").unwrap())
            .await
            .unwrap();
        assert!(young.is_some(), "the young record survives");
        let replays = history.count(|o| *o == Outcome::Ok { replayed: true });
        assert_eq!(replays, 1, "the retry at retention − 1 s was a replay");
        // What the file holds: `young`'s record, `old`'s purged.
        let mut fin = final_sqlite(&dir.path().join("clock.db"), false);
        let (old, young) = (key("clk", "old"), key("clk", "young"));
        assert!(
            fin.effects.contains_key(&young),
            "the young record is read back"
        );
        assert!(
            !fin.records.contains_key(&old),
            "the old record is gone from the file"
        );
        // `old` was purged on purpose: its one effect and record stand as they were before.
        fin.effects.insert(old.clone(), vec!["v1".into()]);
        fin.records.insert(old, vec![None]);
        Report {
            figures: check(&history.ops(), &fin),
            exercised: past + replays as u64,
            what: format!("{replays} replay at retention − 1 s, {past} purged past it, 0 inside"),
            expected_unresolved: 0,
        }
    })
}
