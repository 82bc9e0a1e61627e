//! `Apply` (the broker consumers' seam) for the SQLite inbox: the caller's handler runs on the
//! transaction that records the key, so the effect and the record commit together before the
//! consumer acknowledges.

use std::sync::Arc;

use crate::error::Error;
use crate::inbox::Inbox;
use crate::tx::{HandlerError, OffsetMove, Tx, move_watermark};
use oncebox_core::consume::{Apply, Position, settles_offset};
use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};

/// The SQLite inbox with the handler every new event runs.
pub struct InboxHandler<H> {
    inbox: Inbox,
    handler: Arc<H>,
}

impl<H> Clone for InboxHandler<H> {
    fn clone(&self) -> Self {
        InboxHandler {
            inbox: self.inbox.clone(),
            handler: self.handler.clone(),
        }
    }
}

impl<H> std::fmt::Debug for InboxHandler<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxHandler").finish_non_exhaustive()
    }
}

impl<H> InboxHandler<H>
where
    H: Fn(&mut Tx<'_>, &Event) -> Result<Response, HandlerError> + Send + Sync + 'static,
{
    /// `handler` runs for each new key, on the writer thread, inside the key's transaction: it
    /// must be quick and touch only the connection it is given. It may run more than once for
    /// one key (its batch rolled back by a batch-mate's statement, a retry after its error);
    /// only its work on `tx` commits, once, so an effect outside it would repeat.
    pub fn new(inbox: Inbox, handler: H) -> InboxHandler<H> {
        InboxHandler {
            inbox,
            handler: Arc::new(handler),
        }
    }
}

impl<H> Apply for InboxHandler<H>
where
    H: Fn(&mut Tx<'_>, &Event) -> Result<Response, HandlerError> + Send + Sync + 'static,
{
    async fn watermark(&self, stream: &str, partition: i64) -> Result<Option<i64>, Unavailable> {
        self.inbox
            .offset(stream, partition)
            .await
            .map_err(crate::store::unavailable)
    }

    async fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> Result<Processed, ProcessError> {
        let handler = self.handler.clone();
        // The handler sees the event; the inbox keeps its own copy for the record.
        let seen = event.clone();
        let moving = position.clone();
        // Code that can run again: a batch-mate's statement ending the transaction does not
        // fail it.
        let answer = self
            .inbox
            .process_again(event, move |tx| {
                if let Some(p) = &moving
                    && tx.commit_offset(&p.stream, p.partition, p.offset)? == OffsetMove::Replay
                {
                    // At or below the watermark: recorded as stale, nothing applied.
                    return Err(HandlerError::Stale);
                }
                handler(tx, &seen)
            })
            .await;
        // In a transaction of its own, after the record's (`settles_offset` says why).
        if let Some(p) = position
            && settles_offset(&answer)
        {
            self.inbox
                .write(move |conn| move_watermark(conn, &p.stream, p.partition, p.offset))
                .await
                .map_err(|e| match e {
                    Error::Unavailable(u) => ProcessError::Unavailable(u),
                    Error::Sql(e) => ProcessError::Handler(Box::new(e)),
                })?;
        }
        answer
    }
}
