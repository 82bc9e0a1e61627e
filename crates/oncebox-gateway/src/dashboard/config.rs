//! Sources and routes as the gateway runs them, secrets masked (only their count shows), and
//! each source's retention safety verdict: whether its records outlive the sender's redelivery
//! horizon, so a late redelivery is still recognised as a duplicate.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};
use oncebox_core::FingerprintMode;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::signature::Scheme;
use oncebox_core::store::EventStore;

use super::gate;
use super::layout::{self, Nav, duration};
use crate::Gateway;
use crate::policy::{EventIdRule, SourcePolicy};

/// How long senders of a scheme may redeliver an event: the horizons of the binary's presets
/// (Stripe retries for three days, Standard Webhooks senders about as long, GitHub operators
/// redeliver by hand from a few days of history). Other schemes have no known horizon.
fn horizon(scheme: &Scheme) -> Option<Duration> {
    match scheme {
        Scheme::Stripe | Scheme::Github | Scheme::StandardWebhooks => {
            Some(Duration::from_secs(3 * 24 * 3600))
        }
        _ => None,
    }
}

/// The retention verdict of one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Retention covers the known horizon.
    Safe(Duration),
    /// Retention is shorter: a redelivery after the purge would be processed again.
    Unsafe(Duration),
    /// No known horizon: the operator's call.
    Unknown,
}

pub(crate) fn verdict(p: &SourcePolicy) -> Verdict {
    match horizon(&p.scheme) {
        Some(h) if p.retention >= h => Verdict::Safe(h),
        Some(h) => Verdict::Unsafe(h),
        None => Verdict::Unknown,
    }
}

fn verdict_cell(v: Verdict) -> Markup {
    match v {
        Verdict::Safe(h) => {
            html! { span.badge.ok { "safe" } " covers the sender's " (duration(h)) " of redelivery" }
        }
        Verdict::Unsafe(h) => html! {
            span.badge.bad { "unsafe" } " shorter than the sender's " (duration(h))
            " of redelivery: a late redelivery would be processed again"
        },
        Verdict::Unknown => {
            html! { span.badge.neutral { "unknown" } " no known redelivery horizon for this scheme" }
        }
    }
}

fn event_id(rule: &EventIdRule) -> String {
    match rule {
        EventIdRule::Header(h) => format!("header {h}"),
        EventIdRule::Pointer(p) => format!("JSON {p}"),
        EventIdRule::Derive(fields) => format!(
            "derived from {}",
            fields
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "Idempotency-Key, webhook-id or svix-id, then JSON /id".to_owned(),
    }
}

fn fingerprint(mode: &FingerprintMode) -> String {
    match mode {
        FingerprintMode::Fields(fields) => format!(
            "fields {}",
            fields
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        FingerprintMode::Raw => "raw bytes".to_owned(),
        _ => "canonical JSON".to_owned(),
    }
}

/// A route's URL as far as its host (`oncebox_core::shown::route_url`): a receiver's key may
/// sit in its path (a Slack webhook's) as in its query or user info.
pub(crate) fn masked_url(url: &str) -> String {
    oncebox_core::shown::route_url(url)
}

fn secrets(n: usize) -> String {
    match n {
        0 => "none".to_owned(),
        1 => "1 secret (***)".to_owned(),
        n => format!("{n} secrets (***), rotation"),
    }
}

pub(crate) async fn page<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
) -> Response {
    let access = match gate(&gw, &headers) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let c = &gw.config;
    let body = html! {
        p {
            "Admin token: " @if c.admin_token.is_some() { "set (***)" } @else { "not set: loopback only" }
            @if c.open_sources { br; strong { "Zero-configuration mode:" } " any source name is accepted without a signature check." }
        }
        h2 { "Sources" }
        table.sources {
            thead { tr { th { "source" } th { "signature" } th { "secrets" } th { "tolerance" } th { "event id" }
                         th { "fingerprint" } th { "max body" } th { "retention" } th { "retention verdict" } } }
            tbody {
                @for (name, p) in &c.sources {
                    tr {
                        td { (name.as_str()) }
                        td { (p.scheme.name()) }
                        td { (secrets(p.secrets.len())) }
                        td { (duration(p.tolerance)) }
                        td { (event_id(&p.event_id)) }
                        td { (fingerprint(&p.fingerprint)) }
                        td.num { (p.max_body) " bytes" }
                        td { (duration(p.retention)) }
                        td { (verdict_cell(verdict(p))) }
                    }
                }
            }
        }
        @if c.sources.is_empty() { p.muted { "No configured sources." } }
        p.muted { "Records still owed an outcome (processing, uncertain) are never purged, whatever the retention." }
        h2 { "Routes" }
        table.routes {
            thead { tr { th { "route" } th { "sources" } th { "filter" } th { "url" } th { "timeout" } th { "idempotent" }
                         th { "signing" } th { "status url" } th { "attempts / age" } th { "backoff" } th { "concurrency" } th { "rate" } } }
            tbody {
                @for r in &c.routes {
                    tr {
                        td { (r.name) }
                        td { (r.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")) }
                        td { @if let Some((p, v)) = &r.filter {
                            (p.to_string()) " = " (String::from_utf8_lossy(&v.canonical()))
                        } @else { "all events" } }
                        td { code { (masked_url(&r.url)) } }
                        td { (duration(r.timeout)) }
                        td { (if r.idempotent { "yes" } else { "no" }) }
                        td { (if r.signing_secret.is_some() { "secret (***)" } else { "unsigned" }) }
                        td { (r.status_url.as_deref().map(masked_url).unwrap_or_default()) }
                        td { (r.retry.max_attempts) " / " (duration(r.retry.max_age)) }
                        td { (duration(r.retry.backoff.base)) " … " (duration(r.retry.backoff.cap)) }
                        td.num { (r.concurrency) }
                        td { (r.rate.map(|rate| rate.to_string()).unwrap_or_else(|| "unpaced".to_owned())) }
                    }
                }
            }
        }
        @if c.routes.is_empty() { p.muted { "No routes: events are stored and browsable." } }
    };
    layout::page("Sources & routes", &access, Nav::Config, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_credentials_paths_and_queries() {
        assert_eq!(masked_url("http://h:1/p"), "http://h:1/***");
        assert_eq!(masked_url("amqp://u:pw@h/%2f"), "amqp://***@h/***");
        assert_eq!(masked_url("https://h/p?token=x"), "https://h/***");
        assert_eq!(
            masked_url("https://hooks.slack.com/services/T0/B0/S3CRET"),
            "https://hooks.slack.com/***"
        );
        assert_eq!(masked_url("nats://u@h"), "nats://***@h");
        assert_eq!(masked_url("weird"), "***");
    }

    #[test]
    fn retention_verdict_compares_with_the_horizon() {
        let mut p = SourcePolicy::open();
        assert_eq!(verdict(&p), Verdict::Unknown);
        p.scheme = Scheme::Stripe;
        assert!(matches!(verdict(&p), Verdict::Safe(_)));
        p.retention = Duration::from_secs(3600);
        assert!(matches!(verdict(&p), Verdict::Unsafe(_)));
    }
}
