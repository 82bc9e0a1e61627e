//! One `[sources.<name>]` table validated into a `SourcePolicy`: preset defaults first, explicit
//! settings over them, every problem reported under the field's path.

use std::time::Duration;

use oncebox_core::json::Pointer;
use oncebox_core::retention::{DEFAULT_RETENTION, Retention};
use oncebox_core::signature::{Encoding, Scheme};
use oncebox_core::{FingerprintMode, Source};
use oncebox_gateway::policy::{EventIdRule, OrderGuard, SourcePolicy};

use super::Problems;
use super::presets::{self, Preset, PresetId, preset};
use super::raw::{RawEncoding, RawEventId, RawFingerprint, RawScheme, RawSource};
use super::secrets::secrets;

const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);
/// A retention shorter than this is warned about, whatever the sender: few senders stop
/// retrying sooner, and an operator's resend comes later still.
pub(crate) const SHORT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// More than a day of clock difference is no longer skew; it makes the timestamp check moot.
const MAX_TOLERANCE: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_MAX_BODY: u64 = 1 << 20;
/// Bodies are held in memory while verified and fingerprinted; webhooks are far smaller.
const MAX_MAX_BODY: u64 = 64 << 20;

/// The source's name and policy, or `None` after pushing its problems.
pub(super) fn validate(
    name: &str,
    raw: &RawSource,
    p: &mut Problems<'_>,
    warnings: &mut Vec<String>,
) -> Option<(Source, SourcePolicy)> {
    let path = source_path(name);
    let before = p.count();
    let source = Source::new(name)
        .map_err(|e| p.push(&path, format_args!("invalid source name: {e}")))
        .ok();
    // Valid names are lower-case already, but `ONCEBOX_SOURCES__…` cannot reach a dotted one.
    if source.is_some()
        && let Some(w) = super::variables::unreachable(&path, "source", name)
    {
        warnings.push(w);
    }
    let preset = raw.preset.map(preset);

    let scheme = scheme(&path, raw, preset.as_ref(), p);
    let secrets = match &scheme {
        Some(scheme) => secrets(&path, raw, scheme, p),
        None => Vec::new(),
    };
    if scheme == Some(Scheme::None) {
        warnings.push(format!(
            "source {name}: signature none accepts unsigned events"
        ));
    }

    let tolerance = raw
        .tolerance
        .map(|t| t.0)
        .or(preset.map(|p| p.tolerance))
        .unwrap_or(DEFAULT_TOLERANCE);
    // Signed timestamps are whole seconds: less than one would refuse all but events signed
    // in the very second they arrive.
    if tolerance < Duration::from_secs(1) || tolerance > MAX_TOLERANCE {
        p.push(
            &format!("{path}.tolerance"),
            format_args!(
                "must be at least 1s and at most 1 day, got {}",
                humantime::format_duration(tolerance)
            ),
        );
    }

    // Set where no timestamp is signed, it bounds nothing: an operator reading it would believe
    // a captured request stops being accepted after it.
    if raw.tolerance.is_some()
        && let Some(scheme @ (Scheme::None | Scheme::Github | Scheme::HmacSha256 { .. })) = &scheme
    {
        warnings.push(format!(
            "sources.{name}.tolerance: signature {} signs no timestamp, so the tolerance bounds \
             nothing: a captured request is accepted again at any time (deduplicated by its \
             event id only while its record is kept, its retention)",
            scheme.name()
        ));
    }

    let event_id = match &raw.event_id {
        Some(rule) => event_id(&format!("{path}.event_id"), rule, p),
        None => preset
            .or_else(|| raw.signature.and_then(super::presets::for_scheme))
            .map(|p| match p.event_id {
                PresetId::Header(h) => EventIdRule::Header(h.to_owned()),
                PresetId::Pointer(s) => EventIdRule::Pointer(Pointer::parse(s).unwrap_or_default()),
            }),
    }
    // A signed source's id must come from what the signature covers: the default rule reads
    // `Idempotency-Key` first, which no scheme signs, so anyone holding one signed request
    // could replay it within the tolerance under new ids, each a new event. A scheme without
    // a preset of its own (`hmac-sha256`) signs only the body: its `/id`.
    .unwrap_or_else(|| match scheme {
        Some(Scheme::None) | None => EventIdRule::Default,
        Some(_) => EventIdRule::Pointer(Pointer::from_tokens(vec!["id".to_owned()])),
    });

    let unsigned = scheme
        .as_ref()
        .and_then(|s| presets::unsigned_id_header(name, s, &event_id));
    warnings.extend(unsigned);

    let derived = match &event_id {
        EventIdRule::Derive(fields) => Some(fields.as_slice()),
        _ => None,
    };
    if let Some(fields) = derived {
        warnings.extend(whole_body_derive(
            &format!("{path}.event_id.derive"),
            fields,
        ));
    }
    let preset_fields = preset.and_then(|p| p.fingerprint);
    if preset.is_none() && raw.fingerprint.is_none() && derived.is_none() {
        warnings.extend(
            raw.signature
                .and_then(|s| presets::whole_body_fingerprint(name, s)),
        );
    }
    let (fingerprint, recheck_stored) = match (&raw.fingerprint, derived, preset_fields) {
        // Earlier versions took the whole body for every preset: the records they stored must
        // still answer the retries that come after an upgrade, compared by their payloads.
        (None, None, Some(fields)) => (
            FingerprintMode::Fields(
                fields
                    .iter()
                    .filter_map(|f| Pointer::parse(f).ok())
                    .collect(),
            ),
            true,
        ),
        _ => (
            fingerprint(&path, raw.fingerprint.as_ref(), derived, p),
            false,
        ),
    };

    let max_body = raw.max_body.map_or(DEFAULT_MAX_BODY, |s| s.0);
    if max_body == 0 || max_body > MAX_MAX_BODY {
        p.push(
            &format!("{path}.max_body"),
            format_args!("must be more than 0 and at most 64MiB, got {max_body} bytes"),
        );
    }

    let retention = raw.retention.map_or(DEFAULT_RETENTION, |r| r.0);
    if retention.is_zero() {
        p.push(&format!("{path}.retention"), "must be more than 0");
    } else if let Some(source) = &source {
        check_horizon(&path, source, retention, preset.as_ref(), p);
    }
    let likely = raw.signature.filter(|_| preset.is_none());
    if let Some(sender) = likely.and_then(super::presets::for_scheme)
        && retention < sender.horizon
    {
        warnings.push(format!(
            "source {name}: retention {} is shorter than the {} that {} senders may redeliver \
             for; a redelivery after the purge is taken as a new event (set preset = \"{}\" \
             to refuse such a retention)",
            humantime::format_duration(retention),
            humantime::format_duration(sender.horizon),
            sender.name,
            sender.name,
        ));
    } else if retention < SHORT_RETENTION {
        warnings.push(format!(
            "source {name}: retention {} is shorter than a day; a sender's retry or an \
             operator's resend after the purge is taken as a new event and applied again",
            humantime::format_duration(retention),
        ));
    }

    let order = raw.order.as_ref().map(|o| OrderGuard {
        entity: pointer_into(&format!("{path}.order.entity"), &o.entity, p),
        version: pointer_into(&format!("{path}.order.version"), &o.version, p),
        kind: o
            .kind
            .as_ref()
            .map(|t| pointer_into(&format!("{path}.order.type"), t, p)),
    });

    if p.count() > before {
        return None;
    }
    // Shared with every event of the source, so none copies it.
    let recheck = recheck_stored.then(|| std::sync::Arc::new(fingerprint.clone()));
    Some((
        source?,
        SourcePolicy {
            scheme: scheme?,
            secrets,
            tolerance,
            event_id,
            fingerprint,
            recheck,
            max_body: usize::try_from(max_body).ok()?,
            retention,
            order,
        },
    ))
}

/// `sources.shop`, or `sources."Bad Name"` when the key needs quoting in TOML.
pub(super) fn source_path(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        format!("sources.{name}")
    } else {
        format!("sources.{name:?}")
    }
}

fn scheme(
    path: &str,
    raw: &RawSource,
    preset: Option<&Preset>,
    p: &mut Problems<'_>,
) -> Option<Scheme> {
    // No silent default: a source without a signature must say `signature = "none"`.
    let Some(kind) = raw.signature.or(preset.map(|p| p.signature)) else {
        p.push(
            &format!("{path}.signature"),
            "required (none | standard-webhooks | stripe | github | hmac-sha256), or set a preset",
        );
        return None;
    };
    if kind != RawScheme::HmacSha256 {
        // Refused rather than ignored: the operator believes they change something.
        for (key, set) in [
            ("header", raw.header.is_some()),
            ("encoding", raw.encoding.is_some()),
            ("prefix", raw.prefix.is_some()),
        ] {
            if set {
                p.push(
                    &format!("{path}.{key}"),
                    format_args!(
                        "only used with signature \"hmac-sha256\", not \"{}\"",
                        kind.name()
                    ),
                );
            }
        }
    }
    Some(match kind {
        RawScheme::None => Scheme::None,
        RawScheme::StandardWebhooks => Scheme::StandardWebhooks,
        RawScheme::Stripe => Scheme::Stripe,
        RawScheme::Github => Scheme::Github,
        RawScheme::HmacSha256 => {
            let header_path = format!("{path}.header");
            let header = match &raw.header {
                Some(h) => header_name(&header_path, h, p)?,
                None => {
                    p.push(&header_path, "required for signature \"hmac-sha256\"");
                    return None;
                }
            };
            Scheme::HmacSha256 {
                header,
                encoding: match raw.encoding {
                    None | Some(RawEncoding::Hex) => Encoding::Hex,
                    Some(RawEncoding::Base64) => Encoding::Base64,
                },
                prefix: {
                    let prefix = raw.prefix.clone().unwrap_or_default();
                    // No header value holds one (but a tab): every event would be refused 401.
                    if prefix.chars().any(|c| c.is_control() && c != '\t') {
                        p.push(
                            &format!("{path}.prefix"),
                            "holds a control character, which no signature header can carry",
                        );
                    } else if prefix.starts_with([' ', '\t']) {
                        // Every event would be refused 401, with nothing pointing here.
                        p.push(
                            &format!("{path}.prefix"),
                            "starts with a space or tab, which HTTP strips from the start of \
                             every header value: no signature would match",
                        );
                    }
                    prefix
                },
            }
        }
    })
}

/// The fingerprint a source or consumer compares. Unset beside an id derived from business
/// fields, it is those fields: the id says they are the event, so the same fields in another
/// envelope (a new `sent_at`, the sender's own message id) are a redelivery, not a key reused
/// with another payload — which the whole body would call them, refusing the sender's retry.
pub(super) fn fingerprint(
    path: &str,
    raw: Option<&RawFingerprint>,
    derived: Option<&[Pointer]>,
    p: &mut Problems<'_>,
) -> FingerprintMode {
    match (raw, derived) {
        (None, Some(fields)) => FingerprintMode::Fields(fields.to_vec()),
        (None | Some(RawFingerprint::Json), _) => FingerprintMode::Json,
        (Some(RawFingerprint::Raw), _) => FingerprintMode::Raw,
        (Some(RawFingerprint::Fields(fields)), _) => {
            FingerprintMode::Fields(pointers(&format!("{path}.fingerprint.fields"), fields, p))
        }
    }
}

fn event_id(path: &str, raw: &RawEventId, p: &mut Problems<'_>) -> Option<EventIdRule> {
    match (&raw.header, &raw.pointer, &raw.derive) {
        (Some(h), None, None) => {
            header_name(&format!("{path}.header"), h, p).map(EventIdRule::Header)
        }
        (None, Some(ptr), None) => Some(EventIdRule::Pointer(pointer_into(
            &format!("{path}.pointer"),
            ptr,
            p,
        ))),
        (None, None, Some(fields)) => Some(EventIdRule::Derive(pointers(
            &format!("{path}.derive"),
            fields,
            p,
        ))),
        _ => {
            p.push_one_of(
                path,
                &["header", "pointer", "derive"],
                "set exactly one of header, pointer or derive",
            );
            None
        }
    }
}

/// A header name as the gateway looks it up: an RFC 9110 token, lowercased.
fn header_name(path: &str, name: &str, p: &mut Problems<'_>) -> Option<String> {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        Some(name.to_ascii_lowercase())
    } else {
        p.push(path, format_args!("{name:?} is not a valid header name"));
        None
    }
}

pub(super) fn pointer(path: &str, text: &str, p: &mut Problems<'_>) -> Pointer {
    Pointer::parse(text).unwrap_or_else(|e| {
        p.push(path, format_args!("invalid JSON pointer {text:?}: {e}"));
        Pointer::default()
    })
}

/// A pointer to one value inside the body. The empty pointer names the whole body, which is
/// never an event id, an entity or a version: accepted, it would refuse every event.
pub(super) fn pointer_into(path: &str, text: &str, p: &mut Problems<'_>) -> Pointer {
    if text.is_empty() {
        p.push(
            path,
            "the empty pointer names the whole body; point into it (e.g. \"/id\")",
        );
    }
    pointer(path, text, p)
}

/// The warning for ids derived from the whole body (the empty pointer among `fields`, at
/// `path`): the id is then a hash of the content, the trap of deduplicating by content. Allowed,
/// since a sender with neither ids nor stable fields leaves nothing better.
pub(super) fn whole_body_derive(path: &str, fields: &[Pointer]) -> Option<String> {
    let i = fields.iter().position(|f| f.tokens().is_empty())?;
    Some(format!(
        "{path}[{i}] is the whole body: the id is then a hash of the content, so two genuine \
         events with equal bodies (two equal payments) become one, and a retry whose body \
         differs (a send time in it) is a new event; derive from the fields that name the \
         business fact"
    ))
}

pub(super) fn pointers(path: &str, texts: &[String], p: &mut Problems<'_>) -> Vec<Pointer> {
    if texts.is_empty() {
        p.push(path, "needs at least one JSON pointer");
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| pointer(&format!("{path}[{i}]"), t, p))
        .collect()
}

/// The retention rule of the core (`Retention::set`), with a message that names the field.
fn check_horizon(
    path: &str,
    source: &Source,
    retention: Duration,
    preset: Option<&Preset>,
    p: &mut Problems<'_>,
) {
    let Some(preset) = preset else {
        return;
    };
    if Retention::default()
        .set(source.clone(), retention, Some(preset.horizon))
        .is_err()
    {
        p.push(
            &format!("{path}.retention"),
            format_args!(
                "{} is shorter than the {} preset's redelivery horizon of {}: purging earlier \
                 would let a redelivered event in as new",
                humantime::format_duration(retention),
                preset.name,
                humantime::format_duration(preset.horizon),
            ),
        );
    }
}
