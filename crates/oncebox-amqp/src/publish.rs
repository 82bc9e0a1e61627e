//! The confirm-mode channel quarantined copies are published on: reopened whenever the broker
//! has closed it, and every publish bounded by a deadline, so a broker that stops answering
//! turns a quarantine into a requeue instead of a hang.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, Connection};
use oncebox_core::Source;
use oncebox_core::consume::Reason;
use tokio::sync::{mpsc, oneshot, watch};

use crate::copy::copy_properties;
use crate::message::Quarantine;

/// Why a message could not be quarantined; it is then requeued, never acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuarantineError {
    #[error("publish failed: {0}")]
    Publish(#[from] lapin::Error),
    #[error("the broker refused the quarantined message")]
    Nacked,
    #[error("the quarantine exchange routed the message nowhere")]
    Unroutable,
    /// The copy may still reach the quarantine: a later attempt can then store a second copy,
    /// which is better than acknowledging a message whose only copy may be lost.
    #[error("no confirm from the broker within {0:?}")]
    Timeout(Duration),
    /// Nothing was sent: the copy waited its turn behind one whose confirm did not come, or
    /// the consumer stopped while it waited.
    #[error(
        "waited for its turn behind other quarantined copies (a confirm did not come within \
         {0:?}, or the consumer stopped); nothing sent"
    )]
    Queued(Duration),
    #[error("the consumer stopped before a new publish channel was opened")]
    Stopped,
    /// The message is a copy this queue already quarantined for the same reason: the
    /// quarantine routes back into the queue (or the copy was put back unchanged). Quarantined
    /// again it would go round for ever; held and requeued instead, loudly.
    #[error(
        "this message is a copy this queue quarantined for the same reason; the quarantine \
         routes back into the queue, or the copy was put back unchanged"
    )]
    RoutesBack,
}

/// A request to the consumer's loop, which owns the connection, for a working channel.
type Reopen = oneshot::Sender<Result<Channel, QuarantineError>>;

/// The quarantine's channel, shared by every delivery's task.
pub(crate) struct Publisher {
    current: Mutex<Channel>,
    /// One copy in flight at a time: a `basic.return` names no delivery tag, and lapin hands it
    /// to whichever confirm of the channel completes next, so with several in flight the
    /// return of an unroutable copy could reach another's confirm, and its original be
    /// acknowledged with no copy kept. Quarantines are rare; their confirms take milliseconds.
    one_at_a_time: tokio::sync::Mutex<()>,
    /// The last copy's confirm did not come: the broker is not answering (a resource alarm).
    stalled: AtomicBool,
    reopen: mpsc::Sender<Reopen>,
    /// Bounds each quarantine (reopening included) and each broker call on shutdown.
    pub(crate) deadline: Duration,
    /// The connection's largest frame, which a copy's properties must fit in.
    frame_max: usize,
}

/// The consumer loop's end of [`Publisher`]: it answers reopen requests, since only it holds
/// the connection.
pub(crate) struct Reopens(mpsc::Receiver<Reopen>);

impl Reopens {
    pub(crate) async fn next(&mut self) -> Option<Reopen> {
        self.0.recv().await
    }
}

async fn open(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

impl Publisher {
    pub(crate) async fn open(
        connection: &Connection,
        deadline: Duration,
    ) -> Result<(Arc<Publisher>, Reopens), lapin::Error> {
        let channel = open(connection).await?;
        let (reopen, requests) = mpsc::channel(16);
        let frame_max = usize::try_from(connection.configuration().frame_max());
        let publisher = Publisher {
            current: Mutex::new(channel),
            one_at_a_time: tokio::sync::Mutex::new(()),
            stalled: AtomicBool::new(false),
            reopen,
            deadline,
            frame_max: frame_max.unwrap_or(usize::MAX),
        };
        Ok((Arc::new(publisher), Reopens(requests)))
    }

    fn current(&self) -> Channel {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Answers one reopen request on `connection`. Requests are served one at a time, so a
    /// burst of tasks that all found the channel closed opens one new channel, not many.
    pub(crate) async fn serve(&self, connection: &Connection, reply: Reopen) {
        let current = self.current();
        let answer = if current.status().connected() {
            Ok(current)
        } else {
            match tokio::time::timeout(self.deadline, open(connection)).await {
                Ok(Ok(channel)) => {
                    *self.current.lock().unwrap_or_else(PoisonError::into_inner) = channel.clone();
                    tracing::info!("quarantine channel reopened");
                    Ok(channel)
                }
                Ok(Err(e)) => Err(QuarantineError::Publish(e)),
                Err(_) => Err(QuarantineError::Timeout(self.deadline)),
            }
        };
        let _ = reply.send(answer);
    }

    /// A connected channel: the current one, or a new one when the broker closed it (a publish
    /// to a missing exchange closes the channel with 404; later publishes on it all fail).
    async fn channel(&self) -> Result<Channel, QuarantineError> {
        let current = self.current();
        if current.status().connected() {
            return Ok(current);
        }
        let (reply, answer) = oneshot::channel();
        self.reopen
            .send(reply)
            .await
            .map_err(|_| QuarantineError::Stopped)?;
        answer.await.map_err(|_| QuarantineError::Stopped)?
    }

    /// Publishes `delivery`'s copy with the reason and waits for the broker's confirm, so the
    /// original is acknowledged only once its copy is safe. The publish and its confirm take
    /// at most the deadline; the wait for its turn behind other copies ends after a deadline
    /// when the last copy to finish got no confirm, and at once when the consumer stops
    /// (nothing sent: the message is requeued).
    pub(crate) async fn quarantine(
        &self,
        to: &Quarantine,
        queue: &str,
        source: &Source,
        delivery: &Delivery,
        reason: &Reason,
        stopping: &watch::Receiver<bool>,
    ) -> Result<(), QuarantineError> {
        let props = &delivery.properties;
        let published = [delivery.exchange.as_str(), delivery.routing_key.as_str()];
        let properties = copy_properties(props, reason, queue, source, published, self.frame_max);
        // The wait for the lock is bounded too, while the broker does not answer: behind a copy
        // whose confirm never came (a broker that stopped reading), each waiting in line would
        // otherwise take its own deadline in turn, holding its message and a stop for as many
        // deadlines as there are copies. Nothing was sent yet: the message is requeued. Behind
        // a slow broker that answers, the copy keeps its place in line (the lock is fair).
        let turn = self.one_at_a_time.lock();
        tokio::pin!(turn);
        let mut stop = stopping.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        tokio::pin!(stopped);
        let _one = loop {
            tokio::select! {
                one = &mut turn => break one,
                () = &mut stopped => return Err(QuarantineError::Queued(self.deadline)),
                () = tokio::time::sleep(self.deadline) => {
                    if self.stalled.load(Ordering::Acquire) {
                        return Err(QuarantineError::Queued(self.deadline));
                    }
                }
            }
        };
        let publish = async {
            let confirm = self
                .channel()
                .await?
                .basic_publish(
                    to.exchange.as_str().into(),
                    to.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &delivery.data,
                    properties,
                )
                .await?
                .await?;
            if !confirm.is_ack() {
                return Err(QuarantineError::Nacked);
            }
            if confirm.take_message().is_some() {
                return Err(QuarantineError::Unroutable);
            }
            Ok(())
        };
        let Ok(published) = tokio::time::timeout(self.deadline, publish).await else {
            self.stalled.store(true, Ordering::Release);
            // Its confirm may still come, and a later copy's return with it: the channel is
            // closed (the next copy reopens one) before another copy goes out on it.
            let channel = self.current();
            let closing = channel.close(200, "quarantine confirm timed out".into());
            let _ = tokio::time::timeout(self.deadline, closing).await;
            return Err(QuarantineError::Timeout(self.deadline));
        };
        // The broker answered (or the channel failed at once): copies behind wait their turn.
        self.stalled.store(false, Ordering::Release);
        published
    }

    /// Closes the channel, waiting no longer than the deadline: a blocked broker may never
    /// answer, and the connection's close releases the channel anyway.
    pub(crate) async fn close(&self) {
        let _ =
            tokio::time::timeout(self.deadline, self.current().close(200, "shutdown".into())).await;
    }
}
