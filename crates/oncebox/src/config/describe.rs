//! The human summary `oncebox check` prints: what each source accepts and how, and where each
//! route sends, with secrets shown only as a count and URLs without their password (a route's
//! without any query value).

use std::fmt::Write as _;

use humantime::format_duration;
use oncebox_core::FingerprintMode;
use oncebox_core::json::Pointer;
use oncebox_core::route::Route;
use oncebox_core::signature::{Encoding, Scheme};
use oncebox_gateway::policy::{EventIdRule, SourcePolicy};

use super::{Settings, redact_route_url, redact_url};

/// A multi-line summary of `settings`; contains no secret and no database password.
pub fn describe(settings: &Settings) -> String {
    let gw = &settings.gateway;
    let l = &gw.limits;
    let mut out = String::new();
    // Writing to a String cannot fail; the results are ignored rather than unwrapped.
    let _ = writeln!(out, "listen      {}", settings.listen);
    let _ = writeln!(out, "database    {}", redact_url(&settings.database));
    if let Some(keys) = settings.storage.recent_answers {
        let _ = writeln!(out, "storage     {keys} recent answers kept in memory");
    }
    if let Some(placement) = settings.storage.placement {
        let place = match placement {
            oncebox_sqlite::Placement::Cpu(cpu) => format!("kept on CPU {cpu}"),
            oncebox_sqlite::Placement::Anywhere => "run anywhere".to_owned(),
            _ => "kept on the CPU taking the disk's interrupts".to_owned(),
        };
        let _ = writeln!(out, "storage     writer and checkpointer {place}");
    }
    let admin = if gw.admin_token.is_some() {
        "bearer token set"
    } else {
        "no token: answers loopback peers only"
    };
    let _ = writeln!(out, "admin       {admin}");
    let _ = writeln!(
        out,
        "limits      concurrency {}, connections {}, bodies per client {}, header timeout {}, \
         body timeout {}, shutdown grace {}, retry-after {}",
        l.concurrency,
        l.connections,
        match l.bodies_per_peer {
            0 => "unlimited".to_owned(),
            n => n.to_string(),
        },
        format_duration(l.header_timeout),
        format_duration(l.body_timeout),
        format_duration(l.shutdown_grace),
        format_duration(l.retry_after),
    );
    if gw.open_sources {
        let _ = writeln!(
            out,
            "sources     none configured: any source name is accepted unsigned (zero-config)"
        );
    } else {
        let _ = writeln!(out, "sources     {}", gw.sources.len());
    }
    for (name, policy) in &gw.sources {
        let _ = writeln!(out, "  {name}");
        source(&mut out, policy);
    }
    let _ = writeln!(out, "routes      {}", gw.routes.len());
    for r in &gw.routes {
        route(&mut out, r);
    }
    if !settings.consumers.is_empty() {
        let _ = writeln!(
            out,
            "consumers   {} (run by oncebox consume)",
            settings.consumers.len()
        );
        for c in &settings.consumers {
            super::consumer::describe::text(&mut out, c);
        }
    }
    out
}

/// Where a route sends and what it does with a request that got no answer.
fn route(out: &mut String, r: &Route) {
    let _ = writeln!(out, "  {} -> {}", r.name, redact_route_url(&r.url));
    let sources: Vec<&str> = r.sources.iter().map(|s| s.as_str()).collect();
    let _ = writeln!(out, "    sources      {}", sources.join(", "));
    if let Some((at, value)) = &r.filter {
        let value = String::from_utf8_lossy(&value.canonical()).into_owned();
        let _ = writeln!(out, "    filter       {} = {value}", pointer(at));
    }
    let unanswered = match (r.idempotent, &r.status_url) {
        (true, _) => "sent again with the same key (the receiver honours it)".to_owned(),
        (false, Some(url)) => format!("parked uncertain, settled by {}", redact_route_url(url)),
        (false, None) => "parked uncertain for an operator".to_owned(),
    };
    let _ = writeln!(out, "    no answer    {unanswered}");
    let b = &r.retry.backoff;
    let _ = writeln!(
        out,
        "    retries      up to {} attempts within {}, backoff {} to {}, timeout {}, {} at once per relay{}{}",
        r.retry.max_attempts,
        format_duration(r.retry.max_age),
        format_duration(b.base),
        format_duration(b.cap),
        format_duration(r.timeout),
        r.concurrency,
        r.rate
            .map(|rate| format!(", at most {rate} per relay"))
            .unwrap_or_default(),
        if r.signing_secret.is_some() {
            ", signed"
        } else {
            ""
        },
    );
}

fn source(out: &mut String, s: &SourcePolicy) {
    let secrets = match s.secrets.len() {
        0 => String::new(),
        1 => ", 1 secret".to_owned(),
        n => format!(", {n} secrets"),
    };
    let _ = writeln!(out, "    signature    {}{secrets}", scheme(&s.scheme));
    if timed(&s.scheme) {
        let _ = writeln!(out, "    tolerance    ±{}", format_duration(s.tolerance));
    }
    let _ = writeln!(out, "    event id     {}", event_id(&s.event_id));
    let _ = writeln!(out, "    fingerprint  {}", fingerprint(&s.fingerprint));
    let _ = writeln!(out, "    max body     {}", size(s.max_body));
    let _ = writeln!(out, "    retention    {}", format_duration(s.retention));
    if let Some(order) = &s.order {
        let kind = order
            .kind
            .as_ref()
            .map(|k| format!(" of type {}", pointer(k)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    order        entity {}{kind} by version {}",
            pointer(&order.entity),
            pointer(&order.version)
        );
    }
}

fn scheme(s: &Scheme) -> String {
    match s {
        Scheme::None => "none (unsigned events accepted)".to_owned(),
        Scheme::HmacSha256 {
            header,
            encoding,
            prefix,
        } => {
            let encoding = match encoding {
                Encoding::Hex => "hex",
                Encoding::Base64 => "base64",
                _ => "other",
            };
            format!("hmac-sha256 in header {header} ({encoding}, prefix {prefix:?})")
        }
        other => other.name().to_owned(),
    }
}

/// Schemes that sign a timestamp, for which the tolerance matters.
fn timed(s: &Scheme) -> bool {
    matches!(s, Scheme::StandardWebhooks | Scheme::Stripe)
}

fn event_id(rule: &EventIdRule) -> String {
    match rule {
        EventIdRule::Header(h) => format!("header {h}"),
        EventIdRule::Pointer(p) => format!("JSON {}", pointer(p)),
        EventIdRule::Derive(fields) => format!("derived from {}", pointer_list(fields)),
        EventIdRule::Default => {
            "Idempotency-Key, then webhook-id or svix-id, then JSON /id".to_owned()
        }
        _ => format!("{rule:?}"),
    }
}

fn fingerprint(mode: &FingerprintMode) -> String {
    match mode {
        FingerprintMode::Json => "canonical JSON".to_owned(),
        FingerprintMode::Raw => "raw bytes".to_owned(),
        FingerprintMode::Fields(fields) => format!("fields {}", pointer_list(fields)),
        _ => format!("{mode:?}"),
    }
}

fn pointer(p: &Pointer) -> String {
    let text = p.to_string();
    if text.is_empty() {
        "(whole document)".to_owned()
    } else {
        text
    }
}

fn pointer_list(ps: &[Pointer]) -> String {
    ps.iter().map(pointer).collect::<Vec<_>>().join(", ")
}

fn size(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    match bytes {
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} bytes"),
    }
}

/// What `oncebox check --output json` prints: the same facts as [`describe`], with stable
/// field names; secrets only as counts and URLs without passwords.
pub fn describe_json(settings: &Settings) -> serde_json::Value {
    let gw = &settings.gateway;
    let sources: Vec<_> = gw
        .sources
        .iter()
        .map(|(name, s)| {
            serde_json::json!({
                "name": name.as_str(),
                "signature": s.scheme.name(),
                "secrets": s.secrets.len(),
                "tolerance_secs": s.tolerance.as_secs(),
                "event_id": event_id(&s.event_id),
                "fingerprint": fingerprint(&s.fingerprint),
                "max_body": s.max_body,
                "retention_secs": s.retention.as_secs(),
                "order": s.order.as_ref().map(|o| serde_json::json!({
                    "entity": o.entity.to_string(), "version": o.version.to_string(),
                    "type": o.kind.as_ref().map(ToString::to_string),
                })),
            })
        })
        .collect();
    let routes: Vec<_> = gw
        .routes
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name,
                "sources": r.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "url": redact_route_url(&r.url),
                "idempotent": r.idempotent,
                "signed": r.signing_secret.is_some(),
                "status_url": r.status_url.is_some(),
            })
        })
        .collect();
    serde_json::json!({
        "ok": true,
        "listen": settings.listen.to_string(),
        "database": redact_url(&settings.database),
        "storage": { "recent_answers": settings.storage.recent_answers },
        "admin_token": gw.admin_token.is_some(),
        "open_sources": gw.open_sources,
        "sources": sources,
        "routes": routes,
        "consumers": settings.consumers.iter().map(super::consumer::describe::json).collect::<Vec<_>>(),
        "warnings": settings.warnings,
    })
}
