//! Configuration of `oncebox serve`: `oncebox.toml`, then `ONCEBOX_…` variables, then flags, read
//! once at start and validated into the gateway's policy types before anything listens.

mod attempts;
mod consumer;
mod database;
mod debug;
mod describe;
mod exposure;
mod layers;
mod lease;
mod loops;
mod presets;
mod problems;
mod raw;
mod redact;
mod reuse;
mod route;
mod secrets;
mod source;
mod storage;
#[cfg(test)]
pub(crate) mod tests;
mod values;
mod variables;

pub(crate) use raw::parse_duration;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use oncebox_gateway::policy::{GatewayConfig, Limits};

pub use consumer::{Broker, ConsumerSpec};
pub use describe::{describe, describe_json};
pub(crate) use presets::longest_horizon;
use problems::{Problems, invalid};
use raw::{RawConfig, RawLimits};
use redact::redact_route_url;
pub(crate) use redact::{host_and_path, redact_url};
pub(crate) use route::http_url;
pub(crate) use source::SHORT_RETENTION;
pub use storage::Storage;

const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_DATABASE: &str = "sqlite://oncebox.db";
/// The shortest `relay.poll`: an idle relay's wait between looks for work.
const MIN_RELAY_POLL: Duration = Duration::from_millis(1);
/// The least a relay lease may hold beyond a route's timeout.
const MIN_LEASE_BEYOND_TIMEOUT: Duration = Duration::from_millis(500);
/// Shorter tokens can be guessed online; 16 characters is what a password manager's default gives.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;
/// The admin token earlier documentation showed as an example: refused, since anyone can read it.
const EXAMPLE_ADMIN_TOKEN: &str = "change-me-to-a-long-random-token";

/// Everything `oncebox serve` needs, validated.
pub struct Settings {
    pub listen: SocketAddr,
    pub database: String,
    /// `[storage]`: how the store is opened, past its URL.
    pub storage: Storage,
    pub gateway: GatewayConfig,
    /// Accepted but risky choices, e.g. a source without signature; printed by the caller.
    pub warnings: Vec<String>,
    pub relay: oncebox_relay::RelayOptions,
    /// `[consumers]`: broker queues and streams read by `oncebox consume`.
    pub consumers: Vec<ConsumerSpec>,
}

/// What the command line says; each `Some` wins over the file and the environment.
#[derive(Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub database: Option<String>,
    pub admin_token: Option<String>,
    /// Which secrets the command reads from its environment.
    pub secrets: Secrets,
}

/// Which configured secrets a command reads from its environment. A node that never verifies
/// an event (a relay, a purge job) need not be given the sources' secrets, nor one that never
/// signs a delivery the routes'. Inline secrets in the file are parsed whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Secrets {
    #[default]
    All,
    /// The sources' `secrets_env`: commands that verify or sign events sent to the gateway.
    Inbound,
    /// The routes' `signing_secret_env`: commands that send deliveries.
    Outbound,
    Neither,
}

impl Secrets {
    fn inbound(self) -> bool {
        matches!(self, Secrets::All | Secrets::Inbound)
    }

    fn outbound(self) -> bool {
        matches!(self, Secrets::All | Secrets::Outbound)
    }
}

/// Reads the file, the environment and `overrides`, in that order of precedence, and validates
/// the result. The error lists every problem found, each starting with the field's path.
pub fn load(overrides: &Overrides) -> anyhow::Result<Settings> {
    let figment = layers::layers(overrides)?;
    let raw: RawConfig = figment
        .extract()
        .map_err(|e| invalid(&raw::describe_errors(e)))?;
    let mut problems = Problems::new(&figment, overrides.secrets);
    unknown_variables(&raw, &mut problems);
    let settings = validate(raw, &mut problems);
    match problems.finish() {
        Ok(()) => Ok(settings),
        Err(list) => Err(invalid(&list)),
    }
}

/// Refuses `ONCEBOX_…` variables that set nothing: a mistyped `ONCEBOX_DATABASE` would
/// otherwise leave the gateway on a local SQLite file, and a mistyped table key its default.
/// The secret variables the configuration names are the operator's own, whatever their names.
fn unknown_variables(raw: &RawConfig, p: &mut Problems<'_>) {
    let referenced = raw
        .sources
        .values()
        .flat_map(|s| s.secrets_env.iter())
        .chain(
            raw.routes
                .values()
                .filter_map(|r| r.signing_secret_env.as_ref()),
        )
        .map(String::as_str)
        .collect();
    // A name that is not UTF-8 cannot be one of ours: figment skips it too.
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    for (var, what) in variables::unknown(names.iter().map(String::as_str), &referenced) {
        p.push(&var, what);
    }
}

/// The relay's tuning; its lease must outlast every route's timeout, or a slow attempt would
/// lose its lease before it could record the outcome.
fn relay_options(
    raw: &raw::RawRelay,
    routes: &[oncebox_core::route::Route],
    p: &mut Problems<'_>,
) -> oncebox_relay::RelayOptions {
    let d = oncebox_relay::RelayOptions::default();
    let o = oncebox_relay::RelayOptions {
        lease: raw.lease.map_or(d.lease, |v| v.0),
        idle_poll: raw.poll.map_or(d.idle_poll, |v| v.0),
        batch: raw.batch.unwrap_or(d.batch),
        circuit_threshold: raw.circuit_threshold.unwrap_or(d.circuit_threshold),
        circuit_cooldown: raw.circuit_cooldown.map_or(d.circuit_cooldown, |v| v.0),
    };
    // Beyond the timeout a claim needs time to reach its send and to record the outcome (it
    // may take half of what is left): with a few milliseconds left, every claim would be given
    // back unsent and claimed again at once, forever.
    if let Some(slow) = routes
        .iter()
        .find(|r| o.lease < r.timeout + MIN_LEASE_BEYOND_TIMEOUT)
    {
        p.push(
            "relay.lease",
            format_args!(
                "must be at least 500ms longer than routes.{}.timeout (time to start the send and record its outcome)",
                slow.name
            ),
        );
    }
    // An idle relay waits this long between looks for work: zero would spin a CPU for nothing.
    if o.idle_poll < MIN_RELAY_POLL {
        p.push(
            "relay.poll",
            "must be at least 1ms (0 would keep an idle relay busy looking for work)",
        );
    }
    if o.batch == 0 {
        p.push("relay.batch", "must be at least 1");
    }
    if o.circuit_threshold == 0 {
        p.push("relay.circuit_threshold", "must be at least 1");
    }
    o
}

fn validate(raw: RawConfig, p: &mut Problems<'_>) -> Settings {
    let mut warnings = Vec::new();
    let listen = match raw.listen.as_deref() {
        None => DEFAULT_LISTEN,
        Some(text) => text.parse().unwrap_or_else(|_| {
            p.push(
                "listen",
                format_args!("invalid socket address {text:?} (expected e.g. \"127.0.0.1:8080\")"),
            );
            DEFAULT_LISTEN
        }),
    };
    let database = raw.database.unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
    database::validate(&database, p);
    values::refuse_placeholders(&database, raw.admin_token.as_deref(), p);
    if let Some(token) = &raw.admin_token
        && token.chars().count() < MIN_ADMIN_TOKEN_CHARS
    {
        // The value, and even its length, stay out of the message.
        p.push(
            "admin_token",
            format_args!("must be at least {MIN_ADMIN_TOKEN_CHARS} characters"),
        );
    }
    // The example earlier documentation showed, copied as it was: anyone who read it has it.
    if raw.admin_token.as_deref() == Some(EXAMPLE_ADMIN_TOKEN) {
        p.push(
            "admin_token",
            "is the documentation's example, which anyone can read: generate one (openssl rand -hex 32)",
        );
    }
    // It travels in an `Authorization` header and a cookie's MAC input: a space or a byte
    // outside visible ASCII would be a token no request can present, every login refused.
    if let Some(token) = &raw.admin_token
        && !token.bytes().all(|b| b.is_ascii_graphic())
    {
        p.push(
            "admin_token",
            "must be visible ASCII characters only (no spaces, no control or non-ASCII characters)",
        );
    }
    let limits = limits(&raw.limits, p);
    let storage = storage::validate(&raw.storage, &database, p, &mut warnings);

    // Zero-config (DESIGN §7) is exactly "no source configured".
    let open_sources = raw.sources.is_empty();
    let mut sources = BTreeMap::new();
    for (name, source) in &raw.sources {
        if let Some((name, policy)) = source::validate(name, source, p, &mut warnings) {
            sources.insert(name, policy);
        }
    }
    if open_sources {
        if !listen.ip().to_canonical().is_loopback() {
            p.push(
                "listen",
                format_args!(
                    "refusing to accept unsigned events from the network: {listen} is not a \
                     loopback address and no [sources] are configured (zero-config mode accepts \
                     any source without a signature); configure sources or listen on 127.0.0.1"
                ),
            );
        }
        warnings.push(
            "no sources configured: accepting events for any source name without signature \
             verification (zero-config mode)"
                .to_owned(),
        );
    }
    let configured = raw.sources.keys().map(String::as_str).collect();
    for name in raw.routes.keys() {
        route::check_name(name, p, &mut warnings);
    }
    let routes: Vec<_> = raw
        .routes
        .iter()
        .filter_map(|(name, r)| route::validate(name, r, &configured, open_sources, p))
        .collect();
    reuse::refuse_shared_keys(&sources, &routes, p);
    let relay = relay_options(&raw.relay, &routes, p);
    for name in raw.consumers.keys() {
        let path = format!("consumers.{name}");
        warnings.extend(variables::unreachable(&path, "consumer", name));
    }
    let consumers: Vec<ConsumerSpec> = raw
        .consumers
        .iter()
        .filter_map(|(name, c)| consumer::validate(name, c, p))
        .collect();
    consumer::refuse_shared_queues(&consumers, p);
    // Routes name configured sources only, so a consumer's messages under any other source
    // (a typo, most likely) would be stored and never delivered.
    for c in &consumers {
        if let oncebox_core::consume::KeyRule::Derive(fields) = &c.rules.key {
            let path = format!("consumers.{}.key.derive", c.name);
            warnings.extend(source::whole_body_derive(&path, fields));
        }
        let source = c.rules.source.as_str();
        if !open_sources && !configured.contains(source) {
            warnings.push(format!(
                "consumers.{}.source: no [sources.{source}], so no route can take its \
                 messages: they are stored and never delivered",
                c.name
            ));
        }
        if matches!(c.broker, consumer::Broker::Nats { .. })
            && c.rules.key == oncebox_core::consume::KeyRule::MessageId
        {
            warnings.push(format!(
                "consumers.{}.key: JetStream drops a message whose Nats-Msg-Id the stream saw \
                 within its duplicate window (2 minutes unless the stream sets another) before \
                 any consumer sees it, so the same id with another payload inside the window \
                 is never refused as key-reused nor kept for audit (the first payload still \
                 wins); a key from the payload or another header keeps such conflicts in view",
                c.name
            ));
        }
    }
    loops::warn(&routes, &consumers, &mut warnings);
    lease::warn(&relay, &routes, &mut warnings);
    attempts::warn(&routes, &mut warnings);
    loops::warn_http(listen, &routes, &mut warnings);
    exposure::warn(listen, &sources, &routes, &mut warnings);
    Settings {
        relay,
        consumers,
        listen,
        database,
        storage,
        gateway: GatewayConfig {
            sources,
            open_sources,
            admin_token: raw.admin_token,
            limits,
            routes,
        },
        warnings,
    }
}

fn limits(raw: &RawLimits, p: &mut Problems<'_>) -> Limits {
    let d = Limits::default();
    let concurrency = raw.concurrency.unwrap_or(d.concurrency);
    if concurrency == 0 || concurrency > raw::MAX_CONCURRENCY {
        p.push(
            "limits.concurrency",
            format!("must be from 1 to {}", raw::MAX_CONCURRENCY),
        );
    }
    let connections = raw.connections.unwrap_or(d.connections);
    if connections == 0 || connections > raw::MAX_CONCURRENCY {
        p.push(
            "limits.connections",
            format!("must be from 1 to {}", raw::MAX_CONCURRENCY),
        );
    }
    // 0 is no cap; past the concurrency limit a cap never binds, so no upper bound is needed.
    let bodies_per_peer = raw.bodies_per_peer.unwrap_or(d.bodies_per_peer);
    let header_timeout = raw.header_timeout.map_or(d.header_timeout, |t| t.0);
    let body_timeout = raw.body_timeout.map_or(d.body_timeout, |t| t.0);
    for (key, value) in [
        ("header_timeout", header_timeout),
        ("body_timeout", body_timeout),
    ] {
        if value.is_zero() {
            p.push(&format!("limits.{key}"), "must be more than 0");
        }
    }
    let retry_after = raw.retry_after.map_or(d.retry_after, |t| t.0);
    // `Retry-After` carries whole seconds: less would round to "retry at once".
    if retry_after < Duration::from_secs(1) {
        p.push("limits.retry_after", "must be at least 1s");
    }
    Limits {
        concurrency,
        connections,
        bodies_per_peer,
        header_timeout,
        body_timeout,
        shutdown_grace: raw.shutdown_grace.map_or(d.shutdown_grace, |t| t.0),
        retry_after,
    }
}
