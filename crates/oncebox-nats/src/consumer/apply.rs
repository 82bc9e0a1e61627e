//! What the consumer does with a message whose turn came: the `Apply`, its panics caught, and
//! the settling its outcome asks for.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use oncebox_core::ProcessError;
use oncebox_core::consume::{Apply, Position, Settle, decide};

use super::{Consumer, Stream};

impl<A: Apply> Consumer<A> {
    /// What to do with a message whose turn came: quarantine it (undecodable, or a conflict
    /// whose quarantine is owed), else what the `Apply`'s outcome says.
    pub(super) async fn outcome_of(
        &self,
        at: &Stream<'_>,
        event: Result<oncebox_core::Event, oncebox_core::consume::Reason>,
        owed: Option<oncebox_core::consume::Reason>,
        sequence: u64,
        delivered: i64,
    ) -> Settle {
        let o = &self.options;
        match (event, owed) {
            (Err(reason), _) | (Ok(_), Some(reason)) => Settle::Quarantine(reason),
            (Ok(event), None) => {
                let position = (o.watermark && sequence > 0).then(|| Position {
                    stream: at.watermark.to_owned(),
                    partition: 0,
                    offset: i64::try_from(sequence).unwrap_or(i64::MAX),
                });
                let outcome = self.apply_caught(event, position).await;
                let failed = matches!(outcome, Err(ProcessError::Handler(_)));
                let attempt = match (&outcome, sequence) {
                    (Ok(_), _) => 1,
                    // No sequence to tell the message by: the server's count is all there is.
                    (_, 0) => u32::try_from(delivered.max(1)).unwrap_or(u32::MAX),
                    _ => self
                        .attempts
                        .unsettled((at.created, sequence), delivered, failed),
                };
                if let Some(line) = oncebox_core::consume::worth_a_warning(&outcome, attempt) {
                    tracing::warn!(stream = %o.stream, sequence, "{line}");
                }
                decide(outcome, attempt, &o.retry)
            }
        }
    }

    /// The `Apply`, with a panic taken as a failed handler: counted, requeued, and quarantined
    /// after `max_attempts` like any failure, instead of the message coming back after every
    /// ack wait forever. Whether the `Apply` committed before it panicked is unknown; if it
    /// did, the redelivery is answered as a duplicate, so retrying is safe.
    async fn apply_caught(
        &self,
        event: oncebox_core::Event,
        position: Option<Position>,
    ) -> Result<oncebox_core::Processed, ProcessError> {
        // The call is inside the caught future, so a panic before the `Apply` returns its
        // future is caught too.
        let applied = AssertUnwindSafe(async { self.apply.apply(event, position).await });
        applied.catch_unwind().await.unwrap_or_else(|panic| {
            let what = oncebox_core::consume::panic_message(&*panic);
            tracing::error!(stream = %self.options.stream, panic = %what, "the apply panicked; counted as a failed handler");
            Err(ProcessError::Handler(format!("panicked: {what}").into()))
        })
    }
}
