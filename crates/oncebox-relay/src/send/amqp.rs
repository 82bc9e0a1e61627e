//! One RabbitMQ attempt: a persistent, mandatory publish on a channel of its own in confirm
//! mode, counted delivered only on the broker's ack of a message it routed.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::AMQPErrorKind;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ErrorKind, ExchangeKind};
use oncebox_core::delivery::Attempt;
use oncebox_core::relay_store::Claimed;
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout_at};

use super::CONFIRMED;
use super::http::error_chain;
use crate::target::AmqpTarget;

/// A route's publisher: one connection, opened on first use and opened again after any
/// failure, and on it a confirm-mode channel per publish in flight. A `basic.return` names no
/// delivery tag: lapin hands it to whichever confirm of its channel completes next, and with
/// several publishes in flight on one channel (one acknowledged together with another by a
/// multiple ack) the return of an unroutable message could reach another's confirm, the
/// unroutable one then recorded delivered though no queue holds it. One publish per channel at a
/// time, a return is its own.
pub(crate) struct Publisher {
    target: AmqpTarget,
    open: Mutex<Option<Open>>,
    /// Connections opened so far: each open one is known by its number.
    opened: AtomicU64,
    /// One more than the highest number of a connection a publish found failed: told without
    /// the state's lock, which other publishes may hold past this one's deadline, so that the
    /// next to take the lock drops that connection even when this one could not.
    failed: AtomicU64,
}

struct Open {
    // Dropping it closes the connection, and its channels with it.
    connection: Connection,
    /// Channels whose last publish was confirmed, ready for the next.
    idle: Vec<Channel>,
    number: u64,
    /// When an attempt first found the connection blocked, while it still is.
    blocked_since: Option<Instant>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// How long a connection the broker blocked is kept before an attempt asks whether it still
/// is, and how long that question waits.
const BLOCKED_AT_MOST: Duration = Duration::from_secs(60);
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// Whether the broker closed the publish's channel refusing the publish: 403 (the user may
/// not write to the exchange), 404 (the exchange was deleted since the channel checked it),
/// 406 (the message is over `max_message_size`). Soft errors, closing the channel (the caller
/// checks that the connection is still sound): each publish has a channel of its own, so the
/// refusal is this publish's, and the broker stored nothing. Told as an unknown outcome, each
/// such delivery of a route that is not idempotent was parked uncertain, for an operator to
/// settle.
fn refused(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(a)
        if matches!(a.kind(), AMQPErrorKind::Soft(_)) && matches!(a.get_id(), 403 | 404 | 406))
}

impl Publisher {
    pub(crate) fn new(target: AmqpTarget) -> Publisher {
        Publisher {
            target,
            open: Mutex::new(None),
            opened: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// Publishes attempt `number` of `claimed` and waits for the confirm, all within `timeout`.
    pub(crate) async fn publish(
        &self,
        claimed: &Claimed,
        number: u32,
        timeout: Duration,
    ) -> Attempt {
        let deadline = Instant::now() + timeout;
        // Nothing has left until `basic_publish`: any failure before it is "not sent".
        let (channel, opened) = match timeout_at(deadline, self.channel()).await {
            Ok(Ok(open)) => open,
            Ok(Err(e)) => return Attempt::NotSent(e),
            Err(_) => {
                return Attempt::NotSent(format!(
                    "no channel to {} within {timeout:?}",
                    self.target.server()
                ));
            }
        };
        let properties = properties(claimed, number);
        let options = BasicPublishOptions {
            // An unroutable message comes back instead of vanishing, so it is never counted
            // delivered.
            mandatory: true,
            immediate: false,
        };
        let exchange: ShortString = self.target.exchange.as_str().into();
        let routing_key: ShortString = self.target.routing_key.as_str().into();
        let sent = timeout_at(
            deadline,
            channel.basic_publish(exchange, routing_key, options, &claimed.payload, properties),
        )
        .await;
        let refusal =
            matches!(&sent, Ok(Err(e)) if refused(e)) && self.sound(opened, deadline).await;
        let confirm = match sent {
            Ok(Ok(confirm)) => confirm,
            // The broker closed the channel refusing it; the connection is sound.
            Ok(Err(e)) if refusal => {
                return Attempt::NotSent(format!("refused by the broker: {}", error_chain(&e)));
            }
            Ok(Err(e)) => {
                self.forget(opened, deadline).await;
                return match e.kind() {
                    // Refused before a frame was written: the broker saw nothing.
                    ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_) => {
                        Attempt::NotSent(error_chain(&e))
                    }
                    _ => Attempt::NoAnswer(error_chain(&e)),
                };
            }
            Err(_) => {
                self.forget_unless_blocked(opened, deadline).await;
                return Attempt::NoAnswer(format!("publish not written within {timeout:?}"));
            }
        };
        let confirmed = timeout_at(deadline, confirm).await;
        let refusal =
            matches!(&confirmed, Ok(Err(e)) if refused(e)) && self.sound(opened, deadline).await;
        if let Ok(Ok(Confirmation::Ack(_) | Confirmation::Nack(_))) = &confirmed {
            self.give_back(channel, opened, deadline).await;
        }
        match confirmed {
            Ok(Ok(Confirmation::Ack(None))) => CONFIRMED,
            // Returned (no queue bound for the routing key) and then acked: the broker stored
            // nothing, so trying again later is safe and may succeed once a queue is bound.
            // Retried rather than dead because a consumer that declares its queue after the
            // relay starts is the common cause; the route's caps still end it.
            Ok(Ok(Confirmation::Ack(Some(returned)))) => Attempt::NotSent(format!(
                "returned unroutable by the broker: {} {}",
                returned.reply_code, returned.reply_text
            )),
            // A queue refused the message (full with `reject-publish`, or unavailable), which
            // says nothing of the others it was routed to: they keep their copies. Only a route
            // whose consumers honour the key may publish it again.
            Ok(Ok(Confirmation::Nack(_))) => Attempt::NoAnswer(
                "the broker nacked the message: a queue it was routed to refused it, \
                 others may hold it"
                    .into(),
            ),
            Ok(Ok(Confirmation::NotRequested)) => {
                // The channel lost confirm mode: nothing tells whether the message was stored.
                self.forget(opened, deadline).await;
                Attempt::NoAnswer("published without a confirm".into())
            }
            // The broker closed the channel refusing the publish; the channel is dropped, and
            // the connection, sound, kept.
            Ok(Err(e)) if refusal => {
                Attempt::NotSent(format!("refused by the broker: {}", error_chain(&e)))
            }
            // The connection or channel failed after the publish left, or the confirm did not
            // come in time: the broker may have stored the message.
            Ok(Err(e)) => {
                self.forget(opened, deadline).await;
                Attempt::NoAnswer(format!("no confirm: {}", error_chain(&e)))
            }
            Err(_) => {
                self.forget_unless_blocked(opened, deadline).await;
                Attempt::NoAnswer(format!("no confirm within {timeout:?}"))
            }
        }
    }

    /// A channel of its own for one publish: an idle one, or a new one on the open connection,
    /// or on a new connection when there is none or it failed; with the number of the
    /// connection it is on.
    async fn channel(&self) -> Result<(Channel, u64), String> {
        let mut open = self.open.lock().await;
        if let Some(o) = open.as_mut()
            && o.connection.status().connected()
            && !self.found_failed(o.number)
        {
            // Blocked by a memory or disk alarm (`connection.blocked`): the broker reads
            // nothing this connection sends until it clears, so a publish would wait out its
            // confirm, an unknown outcome (uncertain on a route that does not honour the key)
            // for a message that never left. Not sent; the connection is kept for the
            // alarm's end, not replaced by one the broker would block at its first publish.
            // Past `BLOCKED_AT_MOST` the broker is asked for a channel: one it answers means the
            // flag stuck, and the connection is replaced (below); one it leaves unanswered is
            // still blocked, and kept (replaced, it would be blocked again at its first
            // publish, that publish's outcome unknown, the old connection held open).
            let blocked = o.connection.status().blocked();
            let since = *o.blocked_since.get_or_insert_with(Instant::now);
            let still = |o: &Open| {
                format!(
                    "{} blocks publishing (a memory or disk alarm); nothing was sent (connection {})",
                    self.target.server(),
                    o.number
                )
            };
            if !blocked {
                o.blocked_since = None;
            } else if since.elapsed() < BLOCKED_AT_MOST {
                return Err(still(o));
            } else if !matches!(
                tokio::time::timeout(PROBE_WAIT, o.connection.create_channel()).await,
                Ok(Ok(_))
            ) {
                o.blocked_since = Some(Instant::now());
                return Err(still(o));
            }
        }
        if let Some(o) = open.as_mut()
            && o.connection.status().connected()
            && !self.found_failed(o.number)
            && o.blocked_since.is_none()
        {
            while let Some(channel) = o.idle.pop() {
                if channel.status().connected() {
                    return Ok((channel, o.number));
                }
            }
            let channel = self.confirming(&o.connection).await?;
            return Ok((channel, o.number));
        }
        // A failed connection is dropped (and so closed) before a new one is made.
        *open = None;
        let server = self.target.server();
        let connection = Connection::connect_uri(
            self.target.uri.clone(),
            ConnectionProperties::default().with_connection_name("oncebox-relay".into()),
        )
        .await
        .map_err(|e| format!("connect to {server}: {}", error_chain(&e)))?;
        let channel = self.confirming(&connection).await?;
        let number = self.opened.fetch_add(1, Ordering::Relaxed);
        *open = Some(Open {
            connection,
            idle: Vec::new(),
            number,
            blocked_since: None,
        });
        Ok((channel, number))
    }

    /// The publisher's state, waited for no later than the attempt's `deadline`: another
    /// publish holds it while it connects or opens a channel, which a blocked or silent broker
    /// can stretch to that publish's own deadline. Waiting past ours kept an answered attempt
    /// from being recorded inside its lease (the relay keeps only `timeout` and a margin of it
    /// for an attempt), and a confirmed message then looked abandoned. `None`: not in time.
    /// Free state is taken even past the deadline (the lock is tried before the timer), so a
    /// failure found late still drops its connection.
    async fn state(&self, deadline: Instant) -> Option<tokio::sync::MutexGuard<'_, Option<Open>>> {
        timeout_at(deadline, self.open.lock()).await.ok()
    }

    /// Whether connection `number` is still the open one and connected: a refusal told by a
    /// channel's close is the publish's own, one told by the connection's close (RabbitMQ
    /// closes a connection with 403 too) may have followed a stored message. Not known in
    /// time: not sound, the outcome then unknown.
    async fn sound(&self, number: u64, deadline: Instant) -> bool {
        !self.found_failed(number)
            && self.state(deadline).await.is_some_and(|open| {
                open.as_ref()
                    .is_some_and(|o| o.number == number && o.connection.status().connected())
            })
    }

    /// A channel whose publish was confirmed, for the next publish; one of a connection since
    /// replaced, or one that cannot be put back in time, is dropped.
    async fn give_back(&self, channel: Channel, number: u64, deadline: Instant) {
        if let Some(mut open) = self.state(deadline).await
            && let Some(o) = open.as_mut()
            && o.number == number
        {
            o.idle.push(channel);
        }
    }

    /// Whether a publish found connection `number` failed (`failed`; the open connection is
    /// always the newest, so only the newest failure can name it).
    fn found_failed(&self, number: u64) -> bool {
        number.checked_add(1) == Some(self.failed.load(Ordering::Acquire))
    }

    /// A new channel on `connection`, in confirm mode, the route's exchange checked.
    async fn confirming(&self, connection: &Connection) -> Result<Channel, String> {
        let server = self.target.server();
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("open a channel on {server}: {}", error_chain(&e)))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("confirm mode on {server}: {}", error_chain(&e)))?;
        if !self.target.exchange.is_empty() {
            // Checked once per channel, so a missing exchange is a clean "not sent" instead of
            // a channel closed under a publish, whose outcome could not be told apart from a
            // lost connection.
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    self.target.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    format!(
                        "exchange {:?} on {server}: {}",
                        self.target.exchange,
                        error_chain(&e)
                    )
                })?;
        }
        Ok(channel)
    }

    /// `forget`, but for a connection the broker blocked (a memory or disk alarm), which is
    /// why the publish got no answer in time: kept, so that later attempts see it blocked and
    /// are not sent, instead of a new connection each attempt, each blocked at its first
    /// publish and each held open by the broker with its unconfirmed message for the alarm's
    /// length.
    async fn forget_unless_blocked(&self, number: u64, deadline: Instant) {
        let blocked = self.state(deadline).await.is_some_and(|open| {
            open.as_ref()
                .is_some_and(|o| o.number == number && o.connection.status().blocked())
        });
        if !blocked {
            self.forget(number, deadline).await;
        }
    }

    /// Drops connection `number` after a failure on it; the next attempt opens a new one. One
    /// another publish opened since, after finding this one failed, is left alone: dropping it
    /// would take that publish's confirm with it, and make an answer it was about to get
    /// unknown. Not done in time, the next publish to take the state drops it (`failed`).
    async fn forget(&self, number: u64, deadline: Instant) {
        self.failed
            .fetch_max(number.saturating_add(1), Ordering::AcqRel);
        if let Some(mut open) = self.state(deadline).await
            && open.as_ref().is_some_and(|o| o.number == number)
        {
            *open = None;
        }
    }
}

mod message;
#[cfg(test)]
mod tests;

use message::properties;
