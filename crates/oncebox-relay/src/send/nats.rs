//! One NATS attempt: a JetStream publish with `Nats-Msg-Id` = `{route}:{idempotency key}`,
//! counted delivered only on the stream's PubAck, and never into a stream with interest
//! retention (its PubAck does not mean stored).

use std::fmt;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::{Context, GetStreamByNameErrorKind, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::RetentionPolicy;
use oncebox_core::delivery::Attempt;
use oncebox_core::relay_store::Claimed;
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout_at};

use super::CONFIRMED;
use super::http::error_chain;
use crate::target::NatsTarget;

mod headers;
mod tls;

use headers::headers;

/// A route's publisher: one client, connected on first use. Once connected, the client
/// reconnects by itself after a failure; attempts made meanwhile are "not sent".
pub(crate) struct Publisher {
    target: NatsTarget,
    /// The route's own authorities (`ca_file`), trusted alone when the connection is TLS.
    ca_pem: Option<Vec<u8>>,
    client: Mutex<Option<Connected>>,
}

/// How long a look at the route's stream holds: a stream deleted and made again, with another
/// retention, is seen within this.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// The most of an attempt a look at the stream may take: a client allowed to publish but not
/// to ask JetStream's API waits out its request, and the look is then given up for a minute.
const LOOK_WAIT: Duration = Duration::from_secs(2);

/// How soon a look that found no stream is made again.
const NO_STREAM_AGAIN: Duration = Duration::from_secs(5);

/// The client, its JetStream context, when the stream that captures the route's subject is
/// next looked at (`None`: before the first publish), whether a failed look was said, and why
/// the last look that answered refused the stream (interest retention).
struct Connected {
    client: async_nats::Client,
    js: Context,
    next_look: Option<Instant>,
    unknown_said: bool,
    interest: Option<String>,
    /// The stream the last look found keeping what it acknowledges; `None` when no look
    /// found one (none could be listed, none captured the subject yet).
    checked: Option<Checked>,
}

impl Connected {
    /// `Err` unless the client is connected now.
    fn connected(&self, target: &NatsTarget) -> Result<(), String> {
        match self.client.connection_state() {
            State::Connected => Ok(()),
            state => Err(format!(
                "{} is {state}; the client is reconnecting",
                target.server()
            )),
        }
    }
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    pub(crate) fn new(target: NatsTarget, ca_pem: Option<Vec<u8>>) -> Publisher {
        Publisher {
            target,
            ca_pem,
            client: Mutex::new(None),
        }
    }

    /// Publishes attempt `number` of `claimed` and waits for the PubAck, all within `timeout`.
    pub(crate) async fn publish(
        &self,
        claimed: &Claimed,
        number: u32,
        timeout: Duration,
    ) -> Attempt {
        let deadline = Instant::now() + timeout;
        let headers = match headers(claimed, number) {
            Ok(h) => h,
            Err(e) => return Attempt::NotSent(e),
        };
        let js = match timeout_at(deadline, self.context(timeout)).await {
            Ok(Ok(js)) => js,
            Ok(Err(e)) => return Attempt::NotSent(e),
            Err(_) => {
                return Attempt::NotSent(format!(
                    "no connection to {} within {timeout:?}",
                    self.target.server()
                ));
            }
        };
        let message = PublishMessage::build()
            .payload(claimed.payload.clone().into())
            .headers(headers);
        let sent = timeout_at(
            deadline,
            js.send_publish(self.target.subject.clone(), message),
        )
        .await;
        let ack = match sent {
            Ok(Ok(ack)) => ack,
            // Refused by the client before it queued the message (size, in-flight limit, a
            // full command queue): nothing left.
            Ok(Err(e)) => return Attempt::NotSent(format!("publish: {}", error_chain(&e))),
            Err(_) => return Attempt::NotSent(format!("publish not queued within {timeout:?}")),
        };
        match timeout_at(deadline, ack.into_future()).await {
            // A duplicate PubAck means the stream already holds this key's message: delivered.
            Ok(Ok(ack)) => match self.acked_by(&js, &ack, deadline).await {
                Ok(()) => CONFIRMED,
                Err(why) => Attempt::NoAnswer(why),
            },
            Ok(Err(e)) => match e.kind() {
                // "No responders": no stream captures the subject, so no stream stored the
                // message and no subscriber received it. Safe to publish again later.
                PublishErrorKind::StreamNotFound => Attempt::NotSent(format!(
                    "no stream captures subject {:?}",
                    self.target.subject
                )),
                // The stream answered with an error (limits, storage): it refused the message.
                PublishErrorKind::Other
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::WrongLastSequence
                    if refused_by_stream(&e) =>
                {
                    Attempt::NotSent(format!("the stream refused: {}", error_chain(&e)))
                }
                // Timed out or the connection broke after the message was queued: the stream
                // may have stored it.
                _ => Attempt::NoAnswer(format!("no PubAck: {}", error_chain(&e))),
            },
            Err(_) => Attempt::NoAnswer(format!("no PubAck within {timeout:?}")),
        }
    }

    /// The JetStream context of a connected client, connecting when there is none, once the
    /// stream that captures the route's subject is not known to drop what it acknowledges.
    async fn context(&self, timeout: Duration) -> Result<Context, String> {
        let mut slot = self.client.lock().await;
        let connected = match slot.as_mut() {
            Some(connected) => connected,
            None => {
                let mut options = async_nats::ConnectOptions::new()
                    .name("oncebox-relay")
                    .connection_timeout(timeout);
                // A route that names its authorities means TLS, whatever its scheme: on a
                // `nats://` route the client would otherwise go TLS only when the server's
                // first words asked for it, and send its credentials in plain text to one that
                // did not (or to whoever rewrote them).
                if let Some(pem) = &self.ca_pem {
                    options = options
                        .tls_client_config(tls::trusting(pem)?)
                        .require_tls(true);
                }
                let (options, server) =
                    oncebox_nats::with_credentials(options, &self.target.server);
                let client = options.connect(server).await.map_err(|e| {
                    format!("connect to {}: {}", self.target.server(), error_chain(&e))
                })?;
                let mut js = async_nats::jetstream::new(client.clone());
                js.set_timeout(timeout);
                slot.insert(Connected {
                    client,
                    js,
                    next_look: None,
                    unknown_said: false,
                    interest: None,
                    checked: None,
                })
            }
        };
        // Checked so a message is never queued inside a disconnected client, from where it
        // could leave after the attempt was recorded "not sent"; before the look too, which a
        // client reconnecting would only wait out.
        connected.connected(&self.target)?;
        if connected.next_look.is_none_or(|at| Instant::now() >= at) {
            let wait = LOOK_WAIT.min(timeout / 4);
            let look = tokio::time::timeout(wait, self.look(&connected.js)).await;
            let look = look.unwrap_or_else(|_| Look::Unknown(format!("no answer within {wait:?}")));
            let again = match look {
                Look::Keeps(found) => {
                    (connected.interest, connected.unknown_said) = (None, false);
                    // The same stream as before keeps the sequences it acknowledged.
                    let seen = connected
                        .checked
                        .as_ref()
                        .filter(|c| c.name == found.name && c.created == found.created)
                        .map_or(0, |c| c.sequence);
                    connected.checked = Some(Checked {
                        sequence: seen.max(found.sequence),
                        ..found
                    });
                    LOOK_AGAIN
                }
                // A stream this user cannot list (imported from another account) still takes
                // the publish; one made meanwhile is seen within seconds.
                Look::NoStream => {
                    (connected.interest, connected.unknown_said) = (None, false);
                    connected.checked = None;
                    NO_STREAM_AGAIN
                }
                // Looked at again at every attempt, until the stream is fixed.
                Look::Interest(why) => {
                    connected.interest = Some(why.clone());
                    return Err(why);
                }
                // A look that fails after one found an interest stream keeps that verdict: the
                // stream is not published into on a guess.
                Look::Unknown(_) if connected.interest.is_some() => {
                    return Err(connected.interest.clone().unwrap_or_default());
                }
                Look::Unknown(why) => {
                    // Said once per run of failed looks, then at debug: a user that may only
                    // publish fails every look, and would say so every minute for good.
                    let first = !connected.unknown_said;
                    connected.unknown_said = true;
                    let line = "could not look at the stream that captures the route's subject: \
                        publishing without knowing its retention (a stream with interest \
                        retention keeps nothing no consumer wants, and still acknowledges it); \
                        looked at again in a minute";
                    let subject = &self.target.subject;
                    if first {
                        tracing::warn!(%subject, error = %why, "{line}");
                    } else {
                        tracing::debug!(%subject, error = %why, "{line}");
                    }
                    LOOK_AGAIN
                }
            };
            connected.next_look = Some(Instant::now() + again);
            // And again after the look, which may have waited, just before the publish.
            connected.connected(&self.target)?;
        }
        Ok(connected.js.clone())
    }

    /// What the stream capturing the route's subject is.
    ///
    /// An interest stream is refused: it drops a message that no consumer's filter wants at
    /// that moment (none made yet, one being made again) and still answers the publish with a
    /// sequence, so the delivery would be recorded delivered with nothing kept, and its key's
    /// retries answered "duplicate" in the window. Refused at every attempt, the delivery is
    /// retried and finally dead, which an operator sees; the consumer's quarantine subject is
    /// refused on such a stream for the same reason.
    async fn look(&self, js: &Context) -> Look {
        let subject = &self.target.subject;
        let name = match js.stream_by_subject(subject.as_str()).await {
            Ok(name) => name,
            // The publish then answers "no stream" itself.
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => return Look::NoStream,
            Err(e) => return Look::Unknown(error_chain(&e)),
        };
        let stream = match js.get_stream(&name).await {
            Ok(stream) => stream,
            Err(e) => return Look::Unknown(format!("stream {name}: {}", error_chain(&e))),
        };
        if stream.cached_info().config.retention == RetentionPolicy::Interest {
            return Look::Interest(format!(
                "not published: stream {name}, which captures subject {subject:?}, keeps a \
                 message only while a consumer wants it (interest retention), and acknowledges \
                 one no consumer wants without keeping it; use limits or work-queue retention"
            ));
        }
        let info = stream.cached_info();
        Look::Keeps(Checked {
            name,
            created: info.created.unix_timestamp_nanos(),
            // Its last sequence when looked at: a stream made anew since starts below it.
            sequence: info.state.last_sequence,
        })
    }

    /// Whether the PubAck `ack` means stored. The stream looked at keeps what it acknowledges.
    /// Another that answered (the one looked at deleted and made anew, within the minute a look
    /// holds, under another name; or under its own, which a sequence at or below the last one
    /// seen gives away) is looked at now: one with interest retention may have dropped the
    /// message it acknowledged, which is then an unknown outcome (and the route's stream is
    /// looked at again at the next attempt), as is one that cannot be looked at in time. A
    /// sequence started over shows only in this node's own acks: other publishers into the
    /// stream can carry it past the last one seen, and the next look (within the minute) then
    /// finds it. Without a stream looked at (none could be listed), or with the lock not had by
    /// the deadline, the PubAck is taken at its word.
    async fn acked_by(
        &self,
        js: &Context,
        ack: &PublishAck,
        deadline: Instant,
    ) -> Result<(), String> {
        let acked = ack.stream.as_str();
        let Ok(mut slot) = timeout_at(deadline, self.client.lock()).await else {
            return Ok(());
        };
        let Some(connected) = slot.as_mut() else {
            return Ok(());
        };
        let Some(checked) = connected.checked.as_mut() else {
            return Ok(());
        };
        // A duplicate's sequence is its first copy's, however old.
        let renewed = checked.name == acked && !ack.duplicate && ack.sequence <= checked.sequence;
        if checked.name == acked && !renewed {
            checked.sequence = checked.sequence.max(ack.sequence);
            return Ok(());
        }
        let known = (checked.name == acked).then_some(checked.created);
        drop(slot);
        let wait = LOOK_WAIT.min(deadline.saturating_duration_since(Instant::now()));
        // Needed and not had: whether the stream keeps what it acknowledged is unknown.
        let Ok(Ok(stream)) = tokio::time::timeout(wait, js.get_stream(acked)).await else {
            return Err(format!(
                "acknowledged by stream {acked}, made since the stream was looked at, which \
                 could not be looked at in time: whether it keeps the message is unknown"
            ));
        };
        let info = stream.cached_info();
        // The same stream, its acks come out of order (attempts in flight side by side).
        if known == Some(info.created.unix_timestamp_nanos()) {
            return Ok(());
        }
        let keeps = info.config.retention != RetentionPolicy::Interest;
        if let Ok(mut slot) = timeout_at(deadline, self.client.lock()).await
            && let Some(connected) = slot.as_mut()
        {
            if keeps {
                connected.checked = Some(Checked {
                    name: acked.to_owned(),
                    created: info.created.unix_timestamp_nanos(),
                    sequence: ack.sequence,
                });
            } else {
                connected.next_look = None;
            }
        }
        if keeps {
            Ok(())
        } else {
            Err(format!(
                "acknowledged by stream {acked}, made since the stream was looked at, which \
                 keeps a message only while a consumer wants it (interest retention): it may \
                 have dropped this one"
            ))
        }
    }
}

/// The stream a look found keeping what it acknowledges: its name, when it was made, and the
/// highest sequence it acknowledged since.
struct Checked {
    name: String,
    /// In Unix nanoseconds: a stream made anew under the same name was made later.
    created: i128,
    sequence: u64,
}

/// What a look at the route's stream found.
enum Look {
    /// A stream that keeps what it acknowledges.
    Keeps(Checked),
    /// No stream captures the subject (yet).
    NoStream,
    /// An interest stream: why the message is not published.
    Interest(String),
    /// The look failed (no right to ask JetStream's API, no answer in time).
    Unknown(String),
}

/// Whether a publish error carries the stream's own error answer (it decided not to store).
fn refused_by_stream(e: &async_nats::jetstream::context::PublishError) -> bool {
    std::error::Error::source(e)
        .is_some_and(|s| s.downcast_ref::<async_nats::jetstream::Error>().is_some())
}
