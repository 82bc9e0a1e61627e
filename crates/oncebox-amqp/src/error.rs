//! Why a RabbitMQ consumer's `run` stopped before its shutdown signal, and what a caller can
//! tell from it.

use std::time::Duration;

use crate::consumer::OptionsError;

/// Why `run` stopped before its shutdown signal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The options can never work (see [`ConsumerOptions::check`]); nothing was consumed.
    #[error("options: {0}")]
    Options(#[from] OptionsError),
    /// The connection or channel failed. Unacknowledged messages go back to the queue; run
    /// again on a new connection.
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    /// The broker cancelled the consumer (the queue was deleted).
    #[error("the broker cancelled the consumer")]
    Cancelled,
    /// The channel or connection closed under the consumer.
    #[error("the channel closed")]
    Closed,
    /// The connection the quarantine publishes on ([`Consumer::run_apart`]'s `publishing`)
    /// closed. Nothing reopens a connection by itself: going on, every quarantine failed and
    /// its message went round the queue until the reading connection failed too. Run again
    /// on new connections.
    #[error("the quarantine's connection closed")]
    QuarantineClosed,
    /// A delivery's task failed (a bug: handlers' panics are caught inside it). Its message,
    /// neither acknowledged nor rejected, held a prefetch slot for good: after `prefetch`
    /// such failures the broker sent nothing more and the consumer sat idle. The run ends and
    /// its channel closes, which returns the message to the queue; run again.
    #[error("a delivery's task failed: {0}")]
    TaskFailed(String),
    /// The quarantine exchange does not exist; nothing was consumed. Declare it (and bind a
    /// queue to it), then run again.
    #[error(
        "quarantine exchange {0:?} does not exist: declare it, with a queue bound for the \
         consumed queue's name as routing key"
    )]
    QuarantineMissing(String),
    /// The broker did not answer a call at start within `confirm_timeout`; nothing was
    /// consumed. Run again, on a new connection if this one stays silent.
    #[error("the broker did not answer {call} within {after:?}")]
    Timeout { call: &'static str, after: Duration },
}

impl ConsumeError {
    /// The connection failed on bytes the client library cannot read: a message whose
    /// properties hold text that is no UTF-8 (`message_id`, `content_type`, a header's name;
    /// AMQP allows any bytes there, lapin does not). Its delivery never reaches the consumer,
    /// and the broker hands it back at each connection: it blocks the queue until it is moved
    /// aside, and a quorum queue's delivery limit counts it, with the messages delivered beside
    /// it in that connection (the prefetch).
    pub fn unreadable_message(&self) -> bool {
        matches!(self, ConsumeError::Broker(e) if matches!(e.kind(), lapin::ErrorKind::ParsingError(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::ConsumeError;

    /// What lapin answers when a frame holds a short string that is no UTF-8, as a message's
    /// `message_id` of `\xff\xfe` does, tells from a connection that merely failed.
    #[test]
    fn a_frame_lapin_cannot_parse_is_told_apart() {
        let parsed = lapin::types::parsing::parse_short_string(&[2u8, 0xff, 0xfe][..]);
        let Err(unparsable) = parsed else {
            panic!("lapin read bytes that are no UTF-8 as a short string");
        };
        let e = ConsumeError::Broker(lapin::ErrorKind::ParsingError(unparsable).into());
        assert!(e.unreadable_message(), "{e}");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e = ConsumeError::Broker(lapin::ErrorKind::IOError(reset.into()).into());
        assert!(!e.unreadable_message(), "{e}");
        assert!(!ConsumeError::Closed.unreadable_message());
    }
}
