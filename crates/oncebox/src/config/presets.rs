//! Presets for well-known senders: the defaults a `preset = "…"` fills in, and how long each
//! sender may redeliver an event (the shortest retention that keeps duplicates recognisable).

use std::time::Duration;

use oncebox_core::signature::Scheme;
use oncebox_gateway::policy::EventIdRule;

use super::raw::{RawPreset, RawScheme};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Where a preset takes the event id from.
#[derive(Debug, Clone, Copy)]
pub(super) enum PresetId {
    Header(&'static str),
    Pointer(&'static str),
}

/// Defaults of one preset; explicit settings of the source win over each of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Preset {
    pub name: &'static str,
    pub signature: RawScheme,
    pub event_id: PresetId,
    pub tolerance: Duration,
    /// The sender may deliver the same event again for this long; a shorter retention would
    /// purge the inbox record first and let the redelivery in as a new event.
    pub horizon: Duration,
    /// The fields a retry of one event always repeats, where the sender renders some others
    /// afresh for each attempt; `None`: the whole body.
    pub fingerprint: Option<&'static [&'static str]>,
}

/// What a Stripe event is: its type, time and object snapshot, fixed when the event is made.
/// Not the whole body: `pending_webhooks` is counted again for each attempt (it falls as the
/// account's other endpoints succeed), so a retry after a lost 202 would read as another
/// payload, be refused `422`, and be retried and refused for three days.
const STRIPE_FINGERPRINT: &[&str] = &["/type", "/created", "/data", "/livemode", "/account"];

pub(super) fn preset(which: RawPreset) -> Preset {
    match which {
        // Stripe retries with backoff for up to three days in live mode; `id` is the `evt_…` id.
        RawPreset::Stripe => Preset {
            name: "stripe",
            signature: RawScheme::Stripe,
            event_id: PresetId::Pointer("/id"),
            tolerance: Duration::from_secs(300),
            horizon: 3 * DAY,
            fingerprint: Some(STRIPE_FINGERPRINT),
        },
        // GitHub does not redeliver on its own, but operators redeliver failed deliveries by
        // hand from the hook's "Recent Deliveries" (kept for a few days) with the same
        // `X-GitHub-Delivery`; three days covers that.
        RawPreset::Github => Preset {
            name: "github",
            signature: RawScheme::Github,
            event_id: PresetId::Header("x-github-delivery"),
            tolerance: Duration::from_secs(300),
            horizon: 3 * DAY,
            fingerprint: None,
        },
        // Standard Webhooks senders such as Svix retry on a schedule lasting about three days.
        RawPreset::StandardWebhooks => Preset {
            name: "standard-webhooks",
            signature: RawScheme::StandardWebhooks,
            event_id: PresetId::Header("webhook-id"),
            tolerance: Duration::from_secs(300),
            horizon: 3 * DAY,
            fingerprint: None,
        },
    }
}

/// The longest any preset's sender may redeliver for, and the presets whose senders do: what
/// a purge that cannot tell which sources use a preset must keep. A new preset joins the list.
pub(crate) fn longest_horizon() -> (Duration, Vec<&'static str>) {
    let all = [
        RawPreset::Stripe,
        RawPreset::Github,
        RawPreset::StandardWebhooks,
    ]
    .map(preset);
    let longest = all.iter().map(|p| p.horizon).max().unwrap_or_default();
    let names = all
        .iter()
        .filter(|p| p.horizon == longest)
        .map(|p| p.name)
        .collect();
    (longest, names)
}

/// The preset whose sender signs with `scheme`, if one does: without a preset its horizon is
/// only likely, not known (other senders sign the same way), so the config warns instead of
/// refusing.
pub(super) fn for_scheme(scheme: RawScheme) -> Option<Preset> {
    match scheme {
        RawScheme::Stripe => Some(preset(RawPreset::Stripe)),
        RawScheme::Github => Some(preset(RawPreset::Github)),
        RawScheme::StandardWebhooks => Some(preset(RawPreset::StandardWebhooks)),
        RawScheme::None | RawScheme::HmacSha256 => None,
    }
}

/// A warning for a source signed as a preset's sender signs, with neither the preset nor a
/// fingerprint: the whole body is fingerprinted, where that sender renders parts of it again
/// for each attempt. The scheme names the sender as surely as for the id, but the default is
/// kept: a payload of another sender signing that way, not shaped as the preset's fields,
/// would read every payload under one id as the same, and lose an event silently.
pub(super) fn whole_body_fingerprint(name: &str, scheme: RawScheme) -> Option<String> {
    let sender = for_scheme(scheme)?;
    let fields = sender.fingerprint?;
    let s = sender.name;
    Some(format!(
        "source {name}: signature \"{s}\" without preset = \"{s}\" fingerprints the whole \
         body, but {s} renders parts of it again for each attempt, so its retry of an event \
         after a lost answer is refused 422 key-reused, and refused again at every retry; set \
         preset = \"{s}\" (fingerprint = {{ fields = {fields:?} }}) or name a fingerprint"
    ))
}

/// A warning for a signed source whose event id comes from a header its signature does not
/// cover: anyone holding one signed request can send it again under new ids (within the
/// tolerance, where the scheme signs a time), each taken as a new event. Standard Webhooks
/// signs `webhook-id`; Stripe and plain HMAC sign the body alone. GitHub is left out: its
/// bodies carry no event id, so its preset's id is a header, and the README says what that
/// leaves open.
pub(super) fn unsigned_id_header(
    name: &str,
    scheme: &Scheme,
    rule: &EventIdRule,
) -> Option<String> {
    let EventIdRule::Header(header) = rule else {
        return None;
    };
    let signed = match scheme {
        Scheme::None | Scheme::Github => return None,
        Scheme::StandardWebhooks => Some("webhook-id"),
        Scheme::Stripe | Scheme::HmacSha256 { .. } => None,
        // A scheme added later signs no header until it says so here: warned about.
        _ => None,
    };
    if signed.is_some_and(|h| h.eq_ignore_ascii_case(header)) {
        return None;
    }
    let instead = signed.map_or("a pointer into the signed body".to_owned(), |h| {
        format!("header {h:?}")
    });
    Some(format!(
        "source {name}: event_id header {header:?} is not covered by the signature: anyone \
         holding one signed request can send it again under new ids, each taken as a new \
         event (take the id from {instead})"
    ))
}
