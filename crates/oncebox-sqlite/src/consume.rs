//! `Apply` (the broker consumers' seam) for the SQLite inbox: the caller's handler runs on the
//! transaction that records the key, so the effect and the record commit together before the
//! consumer acknowledges.

use std::sync::Arc;

use crate::inbox::Inbox;
use crate::tx::{HandlerError, OffsetMove, Tx};
use oncebox_core::consume::{Apply, Position};
use oncebox_core::{Event, ProcessError, Processed, Response};

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
    /// `handler` runs once per new key, on the writer thread, inside the key's transaction: it
    /// must be quick and touch only the connection it is given.
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
    async fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> Result<Processed, ProcessError> {
        let handler = self.handler.clone();
        // The handler sees the event; the inbox keeps its own copy for the record.
        let seen = event.clone();
        self.inbox
            .process(event, move |tx| {
                if let Some(p) = &position
                    && tx.commit_offset(&p.stream, p.partition, p.offset)? == OffsetMove::Replay
                {
                    // At or below the watermark: recorded as stale, nothing applied.
                    return Err(HandlerError::Stale);
                }
                handler(tx, &seen)
            })
            .await
    }
}
