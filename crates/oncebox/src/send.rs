//! `oncebox send`: signs a test event with a source's scheme and first secret, posts it to the
//! running gateway, and prints the answer — the quickest way to see a source work end to end.

use anyhow::{Context, Result};
use oncebox_core::signature::sign;
use oncebox_core::{Clock, Source, SystemClock};
use oncebox_gateway::policy::EventIdRule;

use crate::config::Settings;

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
    let id = args
        .id
        .unwrap_or_else(|| format!("evt_test_{}", now.millis()));
    // The id travels in a header under most schemes: one that cannot is the caller's mistake,
    // named here rather than as the HTTP client's "failed to parse header value".
    if reqwest::header::HeaderValue::from_str(&id).is_err() {
        return Err(crate::exit::usage(format!(
            "--id {id:?}: an event id must be printable text without line breaks"
        )));
    }
    // The gateway's own rules (length, characters): refused here with the reason, as a usage
    // error, rather than as the gateway's 400 after a round trip.
    if let Err(e) = oncebox_core::EventId::new(id.clone()) {
        return Err(crate::exit::usage(format!("--id {id:?}: {e}")));
    }
    let base = crate::client::gateway_base(args.url.as_deref(), settings)?;
    // The default body depends on the id alone, so sending the same id again is a duplicate
    // (replayed), not a conflict. It carries the id where the source reads it, as bench's do.
    let body = args.body.unwrap_or_else(|| {
        let mut doc = serde_json::json!({ "id": id, "type": "oncebox.test" });
        crate::client::place_id(&policy.event_id, &mut doc, &id);
        doc.to_string()
    });
    let url = format!("{base}/v1/sources/{source}/events");
    let mut request = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(body.clone());
    match &policy.event_id {
        EventIdRule::Header(name) => request = request.header(name.as_str(), id.as_str()),
        EventIdRule::Default => request = request.header("idempotency-key", id.as_str()),
        // Pointer and derived ids come from the body itself.
        _ => {}
    }
    if let Some(secret) = policy.secrets.first() {
        for (name, value) in sign(&policy.scheme, secret, &id, now, body.as_bytes()) {
            request = request.header(name, value);
        }
    }
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
    let text = response.text().await.unwrap_or_default();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {}{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        if replayed { " (replayed)" } else { "" }
    )?;
    writeln!(out, "{text}")?;
    Ok(status.is_success())
}
