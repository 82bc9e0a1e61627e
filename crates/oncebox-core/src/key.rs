//! Validated identities of an event: its `Source`, its `EventId` and the `Key` pair they form.

use std::fmt;

/// Why a source or event id was refused; the message names the rule broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    #[error("source must be 1 to 64 bytes")]
    SourceLength,
    #[error("source must match [a-z0-9][a-z0-9._-]{{0,63}}")]
    SourceCharacters,
    #[error("event id must be 1 to 255 bytes of UTF-8, got {len}")]
    EventIdLength { len: usize },
    #[error("event id must not contain control characters")]
    EventIdControl,
    #[error("event id must contain a non-whitespace character")]
    EventIdBlank,
    #[error(
        "event id must not end with a space: a delivery's Idempotency-Key header would lose it"
    )]
    EventIdTrailingSpace,
    #[error("event id must be valid UTF-8")]
    EventIdUtf8,
}

/// Who sends: a slug taken from configuration or credentials, never from a payload.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source(String);

impl Source {
    pub const MAX_LEN: usize = 64;

    pub fn new(s: impl Into<String>) -> Result<Source, InvalidKey> {
        let s = s.into();
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(InvalidKey::SourceLength);
        }
        let bytes = s.as_bytes();
        let first_ok = bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit();
        let rest_ok = bytes[1..].iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
        if !(first_ok && rest_ok) {
            return Err(InvalidKey::SourceCharacters);
        }
        Ok(Source(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sender's id for one event. Opaque and case-sensitive: it is never trimmed or normalised,
/// so NFC and NFD spellings, or `A` and `a`, stay different keys. An event received for
/// delivery must also pass [`EventId::deliverable`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(String);

impl EventId {
    pub const MAX_LEN: usize = 255;

    pub fn new(s: impl Into<String>) -> Result<EventId, InvalidKey> {
        let s = s.into();
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(InvalidKey::EventIdLength { len: s.len() });
        }
        if s.chars().any(char::is_control) {
            return Err(InvalidKey::EventIdControl);
        }
        // An all-blank id is almost always a templating bug on the sender's side; accepting it
        // would merge unrelated events under one key.
        if s.chars().all(char::is_whitespace) {
            return Err(InvalidKey::EventIdBlank);
        }
        Ok(EventId(s))
    }

    /// Refuses an id a delivery would change: deliveries carry `{source}:{event_id}` in an
    /// `Idempotency-Key` header, HTTP trims a header value's trailing spaces, and `x ` would
    /// reach the receiver as `x`, another event's key (a tab, the other trimmed character, is
    /// a control character and never valid). Checked where events enter (the gateway, broker
    /// consumers), not where stored keys are read back: a record kept from before stays
    /// readable.
    pub fn deliverable(self) -> Result<EventId, InvalidKey> {
        if self.0.ends_with(' ') {
            Err(InvalidKey::EventIdTrailingSpace)
        } else {
            Ok(self)
        }
    }

    /// Validates bytes from a header or a broker property.
    pub fn from_bytes(b: &[u8]) -> Result<EventId, InvalidKey> {
        if b.len() > Self::MAX_LEN {
            // Checked before UTF-8 decoding so a 10 MB id costs nothing to refuse.
            return Err(InvalidKey::EventIdLength { len: b.len() });
        }
        let s = std::str::from_utf8(b).map_err(|_| InvalidKey::EventIdUtf8)?;
        EventId::new(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The dedup key. Stored as two columns, never concatenated, so `(a:b, c)` and `(a, b:c)` differ.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub source: Source,
    pub event_id: EventId,
}

impl Key {
    pub fn new(source: Source, event_id: EventId) -> Key {
        Key { source, event_id }
    }

    /// Parses both parts, for callers holding plain strings.
    pub fn parse(source: &str, event_id: &str) -> Result<Key, InvalidKey> {
        Ok(Key {
            source: Source::new(source)?,
            event_id: EventId::new(event_id)?,
        })
    }
}

impl fmt::Display for Key {
    /// Display only (logs, idempotency headers); never used as a storage key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.event_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_slugs_follow_the_rule() {
        for ok in ["stripe", "provider-a", "a", "0x.y_z-1", &"a".repeat(64)] {
            assert!(Source::new(ok).is_ok(), "{ok}");
        }
        assert_eq!(Source::new(""), Err(InvalidKey::SourceLength));
        assert_eq!(Source::new("a".repeat(65)), Err(InvalidKey::SourceLength));
        for bad in ["Stripe", "-a", ".a", "a b", "a/b", "a:b", "é", "a\0"] {
            assert_eq!(
                Source::new(bad),
                Err(InvalidKey::SourceCharacters),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn event_ids_are_opaque_but_bounded() {
        assert!(EventId::new("evt_1").is_ok());
        assert!(EventId::new(" padded ").is_ok(), "never trimmed");
        // What a delivery header would keep as it is passes; a trailing space, refused rather
        // than trimmed, does not.
        for kept in [" x", "inner space", "x\u{a0}", "\u{3000}x"] {
            assert!(
                EventId::new(kept).unwrap().deliverable().is_ok(),
                "{kept:?}"
            );
        }
        for lost in ["x ", " padded "] {
            assert_eq!(
                EventId::new(lost).unwrap().deliverable(),
                Err(InvalidKey::EventIdTrailingSpace),
                "{lost:?}"
            );
        }
        assert!(EventId::new("x".repeat(255)).is_ok());
        assert_eq!(EventId::new(""), Err(InvalidKey::EventIdLength { len: 0 }));
        assert_eq!(
            EventId::new("x".repeat(256)),
            Err(InvalidKey::EventIdLength { len: 256 })
        );
        assert_eq!(EventId::new("a\nb"), Err(InvalidKey::EventIdControl));
        assert_eq!(EventId::new("a\0"), Err(InvalidKey::EventIdControl));
        assert_eq!(EventId::new("a\u{85}"), Err(InvalidKey::EventIdControl));
        assert_eq!(EventId::new("   "), Err(InvalidKey::EventIdBlank));
        assert_eq!(
            EventId::from_bytes(&[0xff, 0xfe]),
            Err(InvalidKey::EventIdUtf8)
        );
        let huge = vec![b'x'; 10 << 20];
        assert_eq!(
            EventId::from_bytes(&huge),
            Err(InvalidKey::EventIdLength { len: 10 << 20 })
        );
    }

    #[test]
    fn look_alike_ids_stay_distinct() {
        let nfc = EventId::new("caf\u{e9}").unwrap();
        let nfd = EventId::new("cafe\u{301}").unwrap();
        let full_width = EventId::new("\u{ff21}").unwrap();
        assert_ne!(nfc, nfd);
        assert_ne!(EventId::new("A").unwrap(), EventId::new("a").unwrap());
        assert_ne!(full_width, EventId::new("A").unwrap());
    }

    #[test]
    fn a_source_holds_no_colon() {
        assert!(
            Key::parse("a:b", "c").is_err(),
            "':' is not a source character"
        );
    }

    proptest::proptest! {
        #![proptest_config(oncebox_testkit::seed::Seed::from_env(module_path!()).proptest())]
        /// The wire form `{source}:{event_id}` (the `Idempotency-Key` a delivery carries) gives
        /// back its pair when split at its first `:`, so two keys never share one: `(a, b:c)`
        /// and `(a:b, c)` cannot both exist.
        #[test]
        fn the_wire_form_splits_back_into_its_pair(
            source in "[a-z0-9:._-]{1,40}",
            event_id in "\\PC{1,40}",
        ) {
            let (Ok(s), Ok(e)) = (Source::new(&source), EventId::new(&event_id)) else {
                return Ok(());
            };
            let key = Key::new(s, e);
            let wire = key.to_string();
            proptest::prop_assert_eq!(
                wire.split_once(':'),
                Some((key.source.as_str(), key.event_id.as_str()))
            );
        }
    }
}
