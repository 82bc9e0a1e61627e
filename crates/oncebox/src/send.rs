//! `oncebox send`: signs a test event with a source's scheme and first secret, posts it to the
//! running gateway, and prints the answer — the quickest way to see a source work end to end.

use anyhow::{Context, Result};
use oncebox_core::json::Pointer;
use oncebox_core::{Clock, Source, SystemClock};
use oncebox_gateway::policy::EventIdRule;

use crate::config::Settings;

/// The longest `send` waits for the gateway's answer: past its own body timeout (30 s by
/// default), it has answered or will not.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What to send; unset parts get test values.
#[derive(Debug)]
pub struct SendArgs {
    pub source: String,
    pub id: Option<String>,
    pub body: Option<String>,
    pub url: Option<String>,
}

pub async fn run(settings: &Settings, args: SendArgs) -> Result<bool> {
    let source = Source::new(args.source.as_str())
        .map_err(|e| crate::exit::usage(format!("source {:?}: {e}", args.source)))?;
    let Some(policy) = settings.gateway.source(&source) else {
        return Err(crate::exit::not_found(format!(
            "no source {:?} in the configuration",
            source.as_str()
        )));
    };
    let now = SystemClock.now();
    let given_id = args.id.is_some();
    // A body given without --id keeps the id it holds where the source reads one (`/id` by
    // default): a made-up id in the header, which the gateway reads first, made every send of
    // the same body a new event, and a test of deduplication tested nothing.
    let in_body = || {
        let body = args.body.as_deref()?;
        match &policy.event_id {
            EventIdRule::Default => crate::client::id_at(&Pointer::parse("/id").ok()?, body),
            EventIdRule::Pointer(p) => crate::client::id_at(p, body),
            _ => None,
        }
    };
    let body_id = if given_id { None } else { in_body() };
    // Where a refusal of the id says it came from.
    let named = if body_id.is_some() {
        "the body's id"
    } else {
        "--id"
    };
    let id = args
        .id
        .clone()
        .or(body_id)
        .unwrap_or_else(|| format!("evt_test_{}", now.millis()));
    // Where the id travels in a header, HTTP carries no control character and drops spaces
    // around a value: an id it cannot carry as it is is the caller's mistake, named here
    // rather than as the HTTP client's "failed to parse header value" or, for a leading
    // space, as a signature the gateway (which reads the id without it) does not match. In
    // the body alone (a pointer or a derived id, unsigned or signed over the body) any text
    // goes, as it does for the gateway.
    if let Some(header) = crate::client::id_header(policy)
        && (reqwest::header::HeaderValue::from_str(&id).is_err() || id.starts_with(' '))
    {
        return Err(crate::exit::usage(format!(
            "{named} {id:?}: source {source} carries the event id in the {header} header, which \
             takes no control characters or line breaks and drops a leading space"
        )));
    }
    // The gateway's own rules (length, characters): refused here with the reason, as a usage
    // error, rather than as the gateway's 400 after a round trip.
    if let Err(e) =
        oncebox_core::EventId::new(id.clone()).and_then(oncebox_core::EventId::deliverable)
    {
        return Err(crate::exit::usage(format!("{named} {id:?}: {e}")));
    }
    let base = crate::client::gateway_base(args.url.as_deref(), settings)?;
    if given_id && let Some(body) = &args.body {
        id_agrees_with_body(&source, &policy.event_id, body, &id)?;
    }
    // The default body depends on the id alone, so sending the same id again is a duplicate
    // (replayed), not a conflict. It carries the id where the source reads it, as bench's do.
    let body = args.body.unwrap_or_else(|| {
        let mut doc = serde_json::json!({ "id": id, "type": "oncebox.test" });
        crate::client::place_id(&policy.event_id, &mut doc, &id);
        doc.to_string()
    });
    let url = format!("{base}/v1/sources/{source}/events");
    let client = crate::client::http()
        .timeout(SEND_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    // Stored with the event and sent on by the relay under it: a body that is no JSON (a
    // `raw` source's) is not called JSON.
    let content_type = if serde_json::from_str::<serde::de::IgnoredAny>(&body).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    let request = client
        .post(&url)
        .header("content-type", content_type)
        .body(body.clone());
    let request = crate::client::identified(request, policy, &id, body.as_bytes(), now);
    // `--url` may carry credentials (`http://user:token@host/`): the message names the URL
    // redacted, and the client's error, which repeats it with any secret-named query
    // parameter, goes without it.
    let response = request
        .send()
        .await
        .map_err(reqwest::Error::without_url)
        .with_context(|| format!("POST {}", crate::config::redact_url(&url)))?;
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let location = response
        .headers()
        .get("location")
        .filter(|_| status.is_redirection())
        .map(|l| crate::config::redact_url(&String::from_utf8_lossy(l.as_bytes())));
    let text = response.text().await.unwrap_or_default();
    use std::io::Write;
    let mut out = crate::out::stdout();
    writeln!(
        out,
        "{} {}{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        if replayed { " (replayed)" } else { "" }
    )?;
    if let Some(location) = location {
        writeln!(
            out,
            "redirected to {location}, not followed: a gateway never redirects, so something \
             in front of it answered"
        )?;
    }
    writeln!(out, "{text}")?;
    Ok(status.is_success())
}

/// A source that reads its event id from the body ignores `--id`: the event would be stored
/// under another id than the one asked for, and a test of deduplication would test nothing.
/// A pointer's id is refused when it differs (the caller named both); a derived one is said.
fn id_agrees_with_body(source: &Source, rule: &EventIdRule, body: &str, id: &str) -> Result<()> {
    let stored = match rule {
        EventIdRule::Pointer(p) => crate::client::id_at(p, body),
        _ => crate::client::stored_id(rule, body, id).ok(),
    };
    let Some(stored) = stored.filter(|s| s != id) else {
        // The same, or none found: the gateway's answer says why.
        return Ok(());
    };
    match rule {
        EventIdRule::Pointer(p) => Err(crate::exit::usage(format!(
            "--id {id:?}: source {source} reads the event id from the body at {p}, which holds \
             {stored:?}; the event would be stored as {stored:?}: leave out --id or make the \
             two agree"
        ))),
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "warning: source {source} derives the event id from the body: the event is \
                 stored as {stored:?}, not as --id {id:?}"
            );
            Ok(())
        }
    }
}
