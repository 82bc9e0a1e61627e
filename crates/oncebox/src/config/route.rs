//! One `[routes.<name>]` table validated into a `Route`: its sources must exist, its URL must be
//! an http(s) receiver, a RabbitMQ exchange or a NATS subject, its signing secret a Standard
//! Webhooks secret (HTTP only), its authorities PEM certificates (https and NATS), its caps sane.

use std::collections::BTreeSet;

use oncebox_core::Source;
use oncebox_core::delivery::{Backoff, RetryPolicy};
use oncebox_core::json::{Pointer, Value};
use oncebox_core::route::{DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT, Route};
use oncebox_core::signature::{Scheme, Secret};
use oncebox_relay::Target;
use serde::Deserialize;

use super::Problems;
use super::raw::HumanDuration;

/// The shortest key a route signs with: 128 bits, the least HMAC keys are recommended.
const MIN_SIGNING_KEY_BYTES: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    #[serde(default)]
    pub sources: Vec<String>,
    pub filter: Option<RawFilter>,
    pub url: Option<String>,
    pub timeout: Option<HumanDuration>,
    pub signing_secret: Option<String>,
    pub signing_secret_env: Option<String>,
    #[serde(default)]
    pub idempotent: bool,
    pub status_url: Option<String>,
    pub max_attempts: Option<u32>,
    pub max_age: Option<HumanDuration>,
    pub backoff: Option<RawBackoff>,
    pub concurrency: Option<usize>,
    /// `"50/s"`, `"600/min"` or `"100/h"`: the most requests to the receiver, spaced evenly.
    pub rate: Option<String>,
    /// A PEM file of authorities an `https` receiver's certificate may come from, beside the
    /// system's; a NATS route's server's, alone (and the route then connects over TLS).
    pub ca_file: Option<std::path::PathBuf>,
}

/// `filter = { pointer = "/type", equals = "payment_intent.succeeded" }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFilter {
    pub pointer: String,
    pub equals: toml_value::Scalar,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackoff {
    pub base: Option<HumanDuration>,
    pub cap: Option<HumanDuration>,
}

/// The JSON value a filter compares with: a TOML string, integer or boolean.
pub(super) mod toml_value {
    use serde::Deserialize;

    #[derive(Debug, Clone, Deserialize)]
    #[serde(untagged)]
    pub enum Scalar {
        Bool(bool),
        Int(i64),
        Text(String),
    }
}

const AMQP_FORM: &str = "amqp://user:pass@host:port/vhost?exchange=NAME&routing_key=KEY";
const NATS_FORM: &str = "nats://host:port?subject=NAME (tls:// for TLS)";

/// Whether `text` is an absolute `http(s)://HOST…` URL (`localhost:8080` parses, as scheme
/// `localhost`: the scheme and host are checked too).
pub(crate) fn http_url(text: &str) -> bool {
    reqwest::Url::parse(text)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

/// A route's name is stored with each of its deliveries and shown in logs, metrics and the
/// admin API: printable, without spaces, 1 to 64 bytes, and without `:`, which separates it
/// from the key in a NATS route's message id (`{route}:{key}`): routes `a` and `a:x` into one
/// stream gave events `x:y:z` and `y:z` one id, and the stream dropped the second as a
/// duplicate while it was recorded delivered. One the environment cannot address
/// (`ONCEBOX_ROUTES__NAME__…` keys are lower-cased, and a `.` in them separates tables as
/// `__` does) is warned about.
pub(super) fn check_name(name: &str, p: &mut Problems<'_>, warnings: &mut Vec<String>) {
    let printable = name
        .chars()
        .all(|c| !c.is_control() && !c.is_whitespace() && c != ':');
    if name.is_empty() || name.len() > 64 || !printable {
        p.push(
            &format!("routes.{name:?}"),
            "a route's name must be 1 to 64 bytes without spaces, control characters or `:`",
        );
    } else if let Some(w) = super::variables::unreachable(&format!("routes.{name}"), "route", name)
    {
        warnings.push(w);
    }
}

/// The route, or `None` after pushing its problems. `configured` holds the `[sources]` names.
pub(super) fn validate(
    name: &str,
    raw: &RawRoute,
    configured: &BTreeSet<&str>,
    open_sources: bool,
    p: &mut Problems<'_>,
) -> Option<Route> {
    let path = format!("routes.{name}");
    let before = p.count();
    if raw.sources.is_empty() {
        p.push(&format!("{path}.sources"), "must name at least one source");
    }
    let mut route_sources = Vec::new();
    for s in &raw.sources {
        match Source::new(s.as_str()) {
            // Checked against the names configured, not the sources that passed validation: a
            // source with a bad setting is reported once, under its own path, not again here.
            Ok(src) if open_sources || configured.contains(s.as_str()) => route_sources.push(src),
            Ok(_) => p.push(
                &format!("{path}.sources"),
                format_args!("no source named {s:?}"),
            ),
            Err(e) => p.push(&format!("{path}.sources"), format_args!("{s:?}: {e}")),
        }
    }
    // The empty pointer names the whole body, which no scalar equals: such a route would take
    // every event and deliver none, saying nothing.
    let whole = raw.filter.as_ref().filter(|f| f.pointer.is_empty());
    if whole.is_some() {
        p.push(
            &format!("{path}.filter.pointer"),
            "the empty pointer names the whole body, which no value equals; point into it \
             (e.g. \"/type\")",
        );
    }
    let filter = raw
        .filter
        .as_ref()
        .filter(|f| !f.pointer.is_empty())
        .and_then(|f| match Pointer::parse(&f.pointer) {
            Ok(pointer) => {
                let value = match &f.equals {
                    toml_value::Scalar::Bool(b) => Value::Bool(*b),
                    toml_value::Scalar::Int(i) => {
                        match oncebox_core::json::parse(i.to_string().as_bytes()) {
                            Ok(v) => v,
                            Err(_) => Value::Null,
                        }
                    }
                    toml_value::Scalar::Text(t) => Value::String(t.clone()),
                };
                Some((pointer, value))
            }
            Err(e) => {
                p.push(&format!("{path}.filter.pointer"), e);
                None
            }
        });
    let url = raw.url.clone().unwrap_or_default();
    let target = match &raw.url {
        None => {
            p.push(&format!("{path}.url"), "is required");
            None
        }
        Some(u) => Target::parse(u)
            .map_err(|e| {
                p.push(
                    &format!("{path}.url"),
                    format_args!("{e}; expected http(s)://…, {AMQP_FORM} or {NATS_FORM}"),
                );
            })
            .ok(),
    };
    let broker = target.as_ref().is_some_and(Target::is_broker);
    if broker && (raw.signing_secret.is_some() || raw.signing_secret_env.is_some()) {
        let field = if raw.signing_secret.is_some() {
            "signing_secret"
        } else {
            "signing_secret_env"
        };
        p.push(
            &format!("{path}.{field}"),
            "applies only to http(s) routes: a broker message carries no webhook signature \
             (the broker authenticates the publisher); remove it",
        );
    }
    if broker && raw.status_url.is_some() {
        p.push(
            &format!("{path}.status_url"),
            "applies only to http(s) routes: a broker cannot be asked whether a consumer \
             applied a key; an uncertain publish is settled by an operator; remove it",
        );
    }
    if let Some(status) = &raw.status_url
        && !broker
    {
        // Without `{key}` in what is sent (a fragment never is), one answer would settle every
        // uncertain delivery of the route, the ones the receiver never got as applied too.
        let sent = status.split('#').next().unwrap_or_default();
        if !http_url(&status.replace("{key}", "k")) {
            p.push(
                &format!("{path}.status_url"),
                "must be an http:// or https:// URL (with {key})",
            );
        } else if !sent.contains("{key}") {
            p.push(
                &format!("{path}.status_url"),
                "must contain {key} in its path or query, where each delivery's key goes",
            );
        }
    }
    let ca_pem = raw.ca_file.as_ref().and_then(|file| {
        let at = format!("{path}.ca_file");
        // A plain http:// route speaks no TLS its authorities could verify, unless its
        // status URL does: accepted, an operator could believe deliveries verified against
        // a private CA that go out in plain text.
        let https = |u: &str| {
            u.get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        };
        let plain = matches!(target, Some(Target::Http))
            && !https(&url)
            && !raw.status_url.as_deref().is_some_and(https);
        if plain {
            p.push(
                &at,
                "applies only to https and NATS routes (and a status_url over https): this \
                 route's url and status_url are plain http; remove it",
            );
            return None;
        }
        let amqp = matches!(target, Some(Target::Amqp(_)));
        authorities(&at, file, amqp, p)
    });
    let configured = match (&raw.signing_secret, &raw.signing_secret_env) {
        // Already refused above; reading the secret too would only add noise.
        _ if broker => None,
        (Some(s), None) => Some((format!("{path}.signing_secret"), s.clone(), true)),
        // A command that never sends a delivery does not read it (`Secrets`).
        (None, Some(_)) if !p.secrets.outbound() => None,
        (None, Some(var)) => {
            super::secrets::secret_from_env(&format!("{path}.signing_secret_env"), var, p)
                .map(|(at, s)| (at, s, false))
        }
        (Some(_), Some(_)) => {
            p.push(&path, "set signing_secret or signing_secret_env, not both");
            None
        }
        (None, None) => None,
    };
    let instead = format!("name the variable holding it in {path}.signing_secret_env instead");
    let signing_secret = configured.and_then(|(at, s, inline)| {
        let written = inline && p.in_file(&at);
        if !super::values::usable_secret(&at, &s, &instead, written, p) {
            return None;
        }
        let secret = Secret::parse(&Scheme::StandardWebhooks, &s)
            .map_err(|e| p.push(&at, e))
            .ok()?;
        // We choose this key and receivers trust what it signs: one guessable offline from a
        // single signed delivery must not pass. Sources' keys are the senders' choice.
        if secret.key_len() < MIN_SIGNING_KEY_BYTES {
            p.push(
                &at,
                format_args!(
                    "must decode to at least {MIN_SIGNING_KEY_BYTES} bytes (base64 after the \
                     optional whsec_ prefix); generate one with: echo \"whsec_$(openssl rand \
                     -base64 32)\""
                ),
            );
            return None;
        }
        Some(secret)
    });
    let timeout = raw.timeout.map_or(DEFAULT_TIMEOUT, |t| t.0);
    if timeout.is_zero() {
        p.push(&format!("{path}.timeout"), "must be more than 0");
    }
    let defaults = RetryPolicy::default();
    let backoff = Backoff {
        base: raw
            .backoff
            .as_ref()
            .and_then(|b| b.base)
            .map_or(defaults.backoff.base, |d| d.0),
        cap: raw
            .backoff
            .as_ref()
            .and_then(|b| b.cap)
            .map_or(defaults.backoff.cap, |d| d.0),
    };
    if backoff.base.is_zero() || backoff.cap < backoff.base {
        p.push(
            &format!("{path}.backoff"),
            "base must be more than 0 and cap at least base",
        );
    }
    let retry = RetryPolicy {
        // Unset: as many as the backoff needs for max_age to decide (`attempts.rs`).
        max_attempts: raw.max_attempts.unwrap_or_else(|| {
            let max_age = raw.max_age.map_or(defaults.max_age, |d| d.0);
            RetryPolicy::attempts_for(max_age, backoff)
        }),
        max_age: raw.max_age.map_or(defaults.max_age, |d| d.0),
        backoff,
    };
    // A wait past max_age is cut to a last try at max_age, and the first wait may be the whole
    // base: a max_age not longer than it leaves a failed attempt one more try at most, at
    // max_age, whatever the backoff says. (The base is more than zero, checked above, so this
    // refuses a zero max_age too.)
    if retry.max_age <= retry.backoff.base {
        p.push(
            &format!("{path}.max_age"),
            format_args!(
                "must be longer than backoff.base ({}), or a failed attempt gets one more try \
                 at most, at max_age",
                humantime::format_duration(retry.backoff.base)
            ),
        );
    }
    if retry.max_attempts == 0 {
        p.push(&format!("{path}.max_attempts"), "must be at least 1");
    }
    let concurrency = raw.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if concurrency == 0 || concurrency > super::raw::MAX_CONCURRENCY {
        p.push(
            &format!("{path}.concurrency"),
            format!("must be from 1 to {}", super::raw::MAX_CONCURRENCY),
        );
    }
    let rate = raw.rate.as_deref().and_then(|r| {
        oncebox_core::route::Rate::parse(r)
            .map_err(|e| p.push(&format!("{path}.rate"), e))
            .ok()
    });
    (p.count() == before).then(|| Route {
        name: name.to_owned(),
        sources: route_sources,
        filter,
        url,
        timeout,
        signing_secret,
        idempotent: raw.idempotent,
        status_url: raw.status_url.clone(),
        retry,
        concurrency,
        rate,
        ca_pem,
    })
}

/// The PEM certificates in `file`, which must hold at least one, each one rustls reads (public
/// certificates: the path and the reason are safe to show).
fn authorities(
    at: &str,
    file: &std::path::Path,
    amqp: bool,
    p: &mut Problems<'_>,
) -> Option<Vec<u8>> {
    if amqp {
        p.push(
            at,
            "applies only to https and NATS routes (RabbitMQ routes have no TLS in this build); \
             remove it",
        );
        return None;
    }
    let pem = match std::fs::read(file) {
        Ok(pem) => pem,
        Err(e) => {
            p.push(at, format_args!("cannot read {}: {e}", file.display()));
            return None;
        }
    };
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => {
            // `from_pem_bundle` only finds the PEM blocks: what is inside them is first read
            // when the relay builds the route's client, which rustls refuses whole for one
            // certificate it cannot read, and then every delivery of the route fails. Built
            // here as the relay builds it (the system's authorities aside: they are not this
            // setting's), so such a file is refused now, under its field.
            let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false);
            for ca in certs {
                builder = builder.add_root_certificate(ca);
            }
            match builder.build() {
                Ok(_) => Some(pem),
                Err(e) => {
                    p.push(
                        at,
                        // `{:#}`: reqwest's own text is only "builder error"; its sources say why.
                        format_args!(
                            "{}: a certificate cannot be read: {:#}",
                            file.display(),
                            anyhow::Error::new(e)
                        ),
                    );
                    None
                }
            }
        }
        Ok(_) => {
            p.push(
                at,
                format_args!("{} holds no PEM certificate", file.display()),
            );
            None
        }
        Err(e) => {
            p.push(
                at,
                format_args!("{}: not PEM certificates: {e}", file.display()),
            );
            None
        }
    }
}
