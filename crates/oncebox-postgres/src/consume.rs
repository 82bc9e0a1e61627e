//! `Apply` (the broker consumers' seam) for the PostgreSQL inbox: the caller's handler runs on
//! the transaction that records the key, so the effect and the record commit together before
//! the consumer acknowledges.

use std::sync::Arc;

use futures::future::BoxFuture;
use oncebox_core::consume::{Apply, Position, settles_offset};
use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};

use crate::error::{commit_failed, storage};
use crate::inbox::{Inbox, begin};
use crate::silent::or_unknown;
use crate::tx::{HandlerError, OffsetMove, Tx, move_watermark};

/// The PostgreSQL inbox with the handler every new event runs.
///
/// ```no_run
/// # fn demo(inbox: oncebox_postgres::Inbox) {
/// use oncebox_core::Response;
/// use oncebox_postgres::{InboxHandler, sqlx};
///
/// let apply = InboxHandler::new(inbox, |tx, event| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO payments (body) VALUES ($1)")
///             .bind(&event.payload)
///             .execute(tx.conn())
///             .await?;
///         Ok(Response::completed("ok"))
///     })
/// });
/// # let _ = apply;
/// # }
/// ```
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
    H: for<'t> Fn(&'t mut Tx, &'t Event) -> BoxFuture<'t, Result<Response, HandlerError>>
        + Send
        + Sync
        + 'static,
{
    /// `handler` runs once per new key, inside the key's transaction, and returns a boxed
    /// future (`|tx, event| Box::pin(async move { … })`), as the future borrows both. It holds
    /// a pooled connection and the key's row lock while it runs: keep it to the database work,
    /// on `tx` only, and never `COMMIT` or `ROLLBACK` there (see [`Tx::conn`]).
    pub fn new(inbox: Inbox, handler: H) -> InboxHandler<H> {
        InboxHandler {
            inbox,
            handler: Arc::new(handler),
        }
    }
}

impl<H> Apply for InboxHandler<H>
where
    H: for<'t> Fn(&'t mut Tx, &'t Event) -> BoxFuture<'t, Result<Response, HandlerError>>
        + Send
        + Sync
        + 'static,
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
        let answer = self
            .inbox
            .process(event, move |tx| {
                Box::pin(async move {
                    if let Some(p) = &moving
                        && tx.commit_offset(&p.stream, p.partition, p.offset).await?
                            == OffsetMove::Replay
                    {
                        // At or below the watermark: recorded as stale, nothing applied.
                        return Err(HandlerError::Stale);
                    }
                    handler(tx, &seen).await
                })
            })
            .await;
        // In a transaction of its own, after the record's (`settles_offset` says why).
        if let Some(p) = position
            && settles_offset(&answer)
        {
            self.settle(&p).await?;
        }
        answer
    }
}

impl<H> InboxHandler<H> {
    /// Moves the watermark to `p` in a transaction of its own, its lock wait bounded as every
    /// transaction oncebox begins. A failure is the store's (the statement is oncebox's own):
    /// `Unavailable`, and the consumer's retry is answered from the record and moves it then.
    /// Bounded by `lost_after` as a whole, as every unit of oncebox's own: on a connection
    /// gone silent it waited for good, and the consumer's message with it.
    async fn settle(&self, p: &Position) -> Result<(), ProcessError> {
        let unavailable = |e: sqlx::Error| ProcessError::Unavailable(storage(&e));
        let settle = async {
            let mut tx = begin(&self.inbox.pool, self.inbox.deadline)
                .await
                .map_err(unavailable)?;
            move_watermark(&mut tx, &self.inbox.in_tx, &p.stream, p.partition, p.offset)
                .await
                .map_err(unavailable)?;
            tx.commit()
                .await
                .map_err(|e| ProcessError::Unavailable(commit_failed(&e)))
        };
        or_unknown(self.inbox.lost_after, settle).await
    }
}
