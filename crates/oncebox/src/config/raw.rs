//! The configuration as written (DESIGN §7), before validation, and how figment's errors about
//! it are reported: by field path, and without the value when the field holds a secret.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use figment::Metadata;
use figment::error::{Kind, OneOf};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Fields whose values are secrets, or may be one typed in the wrong field (a secret where its
/// variable's name belongs): errors about them never include the value.
const SECRET_KEYS: &[&str] = &[
    "admin_token",
    "secrets",
    "signing_secret",
    "secrets_env",
    "signing_secret_env",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub listen: Option<String>,
    pub database: Option<String>,
    pub admin_token: Option<String>,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub sources: BTreeMap<String, RawSource>,
    #[serde(default)]
    pub routes: BTreeMap<String, super::route::RawRoute>,
    #[serde(default)]
    pub relay: RawRelay,
    #[serde(default)]
    pub consumers: BTreeMap<String, super::consumer::RawConsumer>,
    #[serde(default)]
    pub storage: super::storage::RawStorage,
}

/// `[relay]`: tuning of the relay that delivers to routes.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRelay {
    pub lease: Option<HumanDuration>,
    pub poll: Option<HumanDuration>,
    pub batch: Option<usize>,
    pub circuit_threshold: Option<u32>,
    pub circuit_cooldown: Option<HumanDuration>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub concurrency: Option<usize>,
    pub connections: Option<usize>,
    pub bodies_per_peer: Option<usize>,
    pub header_timeout: Option<HumanDuration>,
    pub body_timeout: Option<HumanDuration>,
    pub shutdown_grace: Option<HumanDuration>,
    pub retry_after: Option<HumanDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSource {
    pub preset: Option<RawPreset>,
    pub signature: Option<RawScheme>,
    pub header: Option<String>,
    pub encoding: Option<RawEncoding>,
    pub prefix: Option<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub secrets_env: Vec<String>,
    pub tolerance: Option<HumanDuration>,
    pub event_id: Option<RawEventId>,
    pub fingerprint: Option<RawFingerprint>,
    pub max_body: Option<ByteSize>,
    pub retention: Option<HumanDuration>,
    pub order: Option<RawOrder>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum RawPreset {
    #[serde(rename = "stripe")]
    Stripe,
    #[serde(rename = "github")]
    Github,
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum RawScheme {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
    #[serde(rename = "stripe")]
    Stripe,
    #[serde(rename = "github")]
    Github,
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
}

impl RawScheme {
    /// The configuration spelling, for messages.
    pub fn name(self) -> &'static str {
        match self {
            RawScheme::None => "none",
            RawScheme::StandardWebhooks => "standard-webhooks",
            RawScheme::Stripe => "stripe",
            RawScheme::Github => "github",
            RawScheme::HmacSha256 => "hmac-sha256",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum RawEncoding {
    #[serde(rename = "hex")]
    Hex,
    #[serde(rename = "base64")]
    Base64,
}

/// `{ header = … }`, `{ pointer = … }` or `{ derive = […] }`; "exactly one" is checked later so
/// the message can say so instead of serde's "did not match any variant".
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEventId {
    pub header: Option<String>,
    pub pointer: Option<String>,
    pub derive: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOrder {
    pub entity: String,
    pub version: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// `"json"`, `"raw"` or `{ fields = ["/a", "/b"] }`.
pub(super) enum RawFingerprint {
    Json,
    Raw,
    Fields(Vec<String>),
}

impl<'de> Deserialize<'de> for RawFingerprint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FingerprintVisitor)
    }
}

struct FingerprintVisitor;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FieldsTable {
    fields: Vec<String>,
}

impl<'de> Visitor<'de> for FingerprintVisitor {
    type Value = RawFingerprint;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#""json", "raw" or { fields = ["/pointer", …] }"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawFingerprint, E> {
        match v {
            "json" => Ok(RawFingerprint::Json),
            "raw" => Ok(RawFingerprint::Raw),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawFingerprint, A::Error> {
        let table = FieldsTable::deserialize(MapAccessDeserializer::new(map))?;
        Ok(RawFingerprint::Fields(table.fields))
    }
}

/// The longest duration a setting takes: a century. Longer ones mean nothing here, and a time
/// far enough ahead overflows the clocks the durations are added to.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// Most requests or deliveries a concurrency setting admits at once; far more than any host
/// serves, and far below what a semaphore can count.
pub(crate) const MAX_CONCURRENCY: usize = 1_000_000;

/// Parses a humantime duration of at most [`MAX_DURATION`], for settings and flags alike.
pub(crate) fn parse_duration(v: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(v)
        .map_err(|_| format!(r#"invalid duration {v:?} (expected e.g. "30s", "5m", "7d")"#))?;
    if d > MAX_DURATION {
        return Err(format!("duration {v:?} is longer than 100 years"));
    }
    Ok(d)
}

/// A humantime duration such as `"30s"`, `"5m"` or `"7d"`.
#[derive(Debug, Clone, Copy)]
pub(super) struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = HumanDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a duration such as "30s", "5m" or "7d""#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
        parse_duration(v).map(HumanDuration).map_err(E::custom)
    }
}

/// A size in bytes: a plain integer, or digits and a unit (`512KiB`, `1MiB`, `10MB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor)
    }
}

struct SizeVisitor;

impl Visitor<'_> for SizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a size such as "1MiB", "512KiB", "10MB" or a number of bytes"#)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
        parse_size(v).map(ByteSize).ok_or_else(|| {
            E::custom(format!(
                r#"invalid size {v:?} (expected e.g. "1MiB", "512KiB", "10MB" or bytes)"#
            ))
        })
    }
}

/// Digits, optional spaces, then a unit: none or `B`, SI `KB`/`MB`/`GB` (powers of 1000) or
/// binary `KiB`/`MiB`/`GiB` (powers of 1024), in any letter case. `None` on anything else or
/// on overflow.
pub(super) fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let unit: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// Figment's errors as `path: what (in origin)` lines.
pub(super) fn describe_errors(errors: figment::Error) -> Vec<String> {
    errors
        .into_iter()
        .map(|e| {
            let mut keys = e.path.clone();
            let secret = e.path.iter().any(|k| SECRET_KEYS.contains(&k.as_str()));
            let what = match &e.kind {
                Kind::UnknownField(field, expected) => {
                    keys = with_key(&e.path, field);
                    format!("unknown key (expected {})", OneOf(expected))
                }
                Kind::MissingField(field) => {
                    keys = with_key(&e.path, field);
                    "required".to_owned()
                }
                Kind::InvalidType(_, expected) | Kind::InvalidValue(_, expected) if secret => {
                    format!("invalid value (not shown: it may be a secret); expected {expected}")
                }
                _ if secret => "invalid value (not shown: it may be a secret)".to_owned(),
                Kind::Message(m) => without_source_lines(m),
                // Figment's own text quotes serde's list, itself quoted: ``expected `one of
                // `stripe`, …`` ``.
                Kind::UnknownVariant(found, expected) => {
                    format!("unknown value {found:?} (expected {})", OneOf(expected))
                }
                other => other.to_string(),
            };
            let origin = e
                .metadata
                .as_ref()
                .map(|md| origin(md, &keys.join(".")))
                .unwrap_or_default();
            if keys.is_empty() {
                format!("{what}{origin}")
            } else {
                format!("{}: {what}{origin}", keys.join("."))
            }
        })
        .collect()
}

/// The path to `key`: figment's path ends with it for some errors and not for others.
fn with_key(path: &[String], key: &str) -> Vec<String> {
    let mut keys = path.to_vec();
    if path.last().is_none_or(|last| last != key) {
        keys.push(key.to_owned());
    }
    keys
}

/// TOML syntax errors quote the offending line, which may hold a secret: keep the position and
/// the explanation, drop the `12 | …` quote and its `|   ^` underline, on one line.
fn without_source_lines(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| {
            let after_number = line.trim_start_matches(|c: char| c.is_ascii_digit());
            !line.is_empty() && !after_number.trim_start().starts_with('|')
        })
        .collect::<Vec<_>>()
        .join(": ")
}

/// ` (in FILE)` or ` (from environment variable …)`: where the value at `path` (`a.b.c`) came
/// from.
pub(super) fn origin(md: &Metadata, path: &str) -> String {
    match &md.source {
        Some(figment::Source::File(file)) => format!(" (in {})", file.display()),
        _ if md.name == super::layers::NESTED_ENV && !path.is_empty() => {
            format!(" (from environment variable {})", env_var(path))
        }
        _ => format!(" (from {})", md.name),
    }
}

/// The variable that sets the field at `path` through the `__` nesting: `sources.shop.tolerance`
/// is `ONCEBOX_SOURCES__SHOP__TOLERANCE` (figment lowercases the names it reads, so any case
/// of it set the value; this is the one people write).
fn env_var(path: &str) -> String {
    format!("ONCEBOX_{}", path.replace('.', "__").to_ascii_uppercase())
}
