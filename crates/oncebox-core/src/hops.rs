//! The loop guard: how many times oncebox has passed an event on. Every delivery a relay sends
//! carries `oncebox-hops`, one more than the event it came from arrived with, and a gateway or
//! consumer refuses an event that arrives with [`MAX_HOPS`] or more. A route that publishes into
//! a queue its own source consumes (or two gateways whose routes post to each other) makes each
//! pass a new event under a new key, which no deduplication can stop; this ends such a loop
//! after a bounded number of rounds instead of never.

/// The header a delivery's hop count travels in (HTTP, AMQP). Case matters in NATS headers:
/// there it is [`NATS_HOPS_HEADER`].
pub const HOPS_HEADER: &str = "oncebox-hops";

/// The hop count's header as NATS messages carry it, spelt as the other `Oncebox-` headers are.
pub const NATS_HOPS_HEADER: &str = "Oncebox-Hops";

/// An event that arrives having passed through this many relays is refused: a chain of
/// gateways and brokers that long is a loop, not a topology. AWS Lambda stops recursive loops
/// after 16 invocations as well.
pub const MAX_HOPS: u32 = 16;

/// Why an arriving event's hop count refuses it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HopsError {
    /// The header is not a decimal count.
    #[error("header {HOPS_HEADER} is not a decimal count of hops")]
    Invalid,
    /// The event went round at least [`MAX_HOPS`] times.
    #[error(
        "the event has passed through {0} oncebox relays (refused from {MAX_HOPS} on): a route delivers back into its own source, directly or through others"
    )]
    Limit(u32),
}

impl HopsError {
    /// The problem type and quarantine reason it is reported as.
    pub fn slug(&self) -> &'static str {
        match self {
            HopsError::Invalid => "hops-invalid",
            HopsError::Limit(_) => "hop-limit",
        }
    }
}

/// The hop count an event arrived with: 0 without the header (a sender that is no oncebox
/// relay), or refused (see [`HopsError`]). Surrounding spaces and tabs are allowed, as in any
/// header value; a sign, a fraction or any other byte is not.
pub fn arrived(value: Option<&[u8]>) -> Result<u32, HopsError> {
    let Some(value) = value else { return Ok(0) };
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(HopsError::Invalid);
    }
    // Leading zeros are still a count; a count past `u32` is past the limit by far.
    let hops = digits.iter().try_fold(0u32, |n, d| {
        n.checked_mul(10)?.checked_add(u32::from(d - b'0'))
    });
    match hops {
        Some(hops) if hops < MAX_HOPS => Ok(hops),
        Some(hops) => Err(HopsError::Limit(hops)),
        None => Err(HopsError::Limit(u32::MAX)),
    }
}

/// The hop count of a message carrying `values` in its hop headers: the highest, so that a
/// sender in the loop cannot lower it by adding a header; 0 without any.
pub fn highest<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Result<u32, HopsError> {
    values
        .into_iter()
        .try_fold(0, |most, value| Ok(most.max(arrived(Some(value))?)))
}

/// The count a delivery of an event that arrived with `hops` carries: one relay more.
pub fn sent(hops: u32) -> u32 {
    hops.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_strictly_and_bounded() {
        assert_eq!(arrived(None), Ok(0));
        assert_eq!(arrived(Some(b"0")), Ok(0));
        assert_eq!(arrived(Some(b" 3\t")), Ok(3));
        assert_eq!(arrived(Some(b"015")), Ok(15));
        assert_eq!(arrived(Some(b"16")), Err(HopsError::Limit(16)));
        assert_eq!(
            arrived(Some(b"4294967295")),
            Err(HopsError::Limit(u32::MAX))
        );
        assert_eq!(
            arrived(Some(b"99999999999999999999")),
            Err(HopsError::Limit(u32::MAX))
        );
        for bad in [
            &b""[..],
            b" ",
            b"-1",
            b"+1",
            b"1.0",
            b"1e3",
            b"one",
            b"1 2",
            b"\xff",
        ] {
            assert_eq!(arrived(Some(bad)), Err(HopsError::Invalid), "{bad:?}");
        }
        assert_eq!(highest([&b"1"[..], b"7", b" 3"]), Ok(7));
        assert_eq!(highest([&b"1"[..], b"16"]), Err(HopsError::Limit(16)));
        assert_eq!(highest(std::iter::empty()), Ok(0));
        assert_eq!(sent(0), 1);
        assert_eq!(sent(u32::MAX), u32::MAX);
        assert_eq!(HopsError::Limit(16).slug(), "hop-limit");
        assert!(HopsError::Limit(16).to_string().contains("16"));
    }
}
