//! A handler that asks its own inbox for its own key is told at once that it holds the key:
//! the claim would otherwise wait for the handler's transaction, until the deadline, and
//! answer "retry later" on every delivery. Another key from inside a handler is processed.

use std::sync::{Arc, Mutex};

use oncebox_core::{Begun, ManualClock, ProcessError, Processed, Response};
use oncebox_postgres::Inbox;
use oncebox_testkit::{event, run};

use crate::harness::{options, schema, url};

#[test]
fn a_handler_asking_for_its_own_key_is_refused_and_another_key_is_processed() {
    run(async {
        let Some(_) = url() else { return };
        let clock = ManualClock::new(oncebox_testkit::EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock)).await.unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (inner, said) = (inbox.clone(), seen.clone());
        let outer = inbox
            .process(event("shop", "outer", 1), move |_tx| {
                Box::pin(async move {
                    let same = inner
                        .process(event("shop", "outer", 1), |_| {
                            Box::pin(async { Ok(Response::completed("never")) })
                        })
                        .await;
                    let leased = inner
                        .begin(event("shop", "outer", 1), std::time::Duration::from_secs(5))
                        .await;
                    let other = inner
                        .process(event("shop", "inner", 1), |_| {
                            Box::pin(async { Ok(Response::completed("inner")) })
                        })
                        .await;
                    let mut said = said.lock().unwrap();
                    for answer in [same.map(|_| ()), leased.map(|_: Begun| ())] {
                        said.push(match answer {
                            Err(ProcessError::Handler(e)) => e.to_string(),
                            other => format!("not refused: {other:?}"),
                        });
                    }
                    said.push(format!("{other:?}"));
                    Ok(Response::completed("outer"))
                })
            })
            .await
            .unwrap();
        assert_eq!(outer, Processed::Applied(Response::completed("outer")));
        let said = seen.lock().unwrap().clone();
        for refusal in &said[..2] {
            assert!(refusal.contains("from inside its own handler"), "{said:?}");
        }
        assert_eq!(
            said[2],
            format!(
                "{:?}",
                Ok::<_, ProcessError>(Processed::Applied(Response::completed("inner")))
            )
        );
    });
}
