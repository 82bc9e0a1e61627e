//! Presets for well-known senders: the defaults a `preset = "…"` fills in, and how long each
//! sender may redeliver an event (the shortest retention that keeps duplicates recognisable).

use std::time::Duration;

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
}

pub(super) fn preset(which: RawPreset) -> Preset {
    match which {
        // Stripe retries with backoff for up to three days in live mode; `id` is the `evt_…` id.
        RawPreset::Stripe => Preset {
            name: "stripe",
            signature: RawScheme::Stripe,
            event_id: PresetId::Pointer("/id"),
            tolerance: Duration::from_secs(300),
            horizon: 3 * DAY,
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
        },
        // Standard Webhooks senders such as Svix retry on a schedule lasting about three days.
        RawPreset::StandardWebhooks => Preset {
            name: "standard-webhooks",
            signature: RawScheme::StandardWebhooks,
            event_id: PresetId::Header("webhook-id"),
            tolerance: Duration::from_secs(300),
            horizon: 3 * DAY,
        },
    }
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
