//! Tests of configuration loading: the DESIGN §7 example, zero-config and the database setting
//! here, every validation rule in `rules`, route URLs in `routes`, the relay's timing in
//! `relay`, layering and secret handling in `layers`.

use std::net::SocketAddr;
use std::time::Duration;

use figment::Jail;
use oncebox_core::json::Pointer;
use oncebox_core::signature::Scheme;
use oncebox_core::{FingerprintMode, Source};
use oncebox_gateway::policy::{EventIdRule, SourcePolicy};

use super::{Overrides, Settings, load};

mod exposure;
mod layers;
mod redact;
mod refusals;
mod relay;
mod routes;
mod rules;
mod sizes;

const SHOP_SECRET: &str = "whsec_c2hvcC1zaWduaW5nLWtleS0wMTIzNDU2Nzg5";
const SHOP_SECRET_2: &str = "whsec_YW5vdGhlci1zaG9wLWtleS1hYmNkZWZnaGlq";
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// DESIGN §7's example with real values in place of `…`.
fn design_example() -> String {
    format!(
        r#"
listen = "127.0.0.1:8080"
database = "sqlite://oncebox.db"
admin_token = "{ADMIN_TOKEN}"

[sources.shop]
preset = "standard-webhooks"
signature = "standard-webhooks"
secrets = ["{SHOP_SECRET}"]
tolerance = "5m"
event_id = {{ header = "webhook-id" }}
fingerprint = "json"
max_body = "1MiB"
retention = "7d"
order = {{ entity = "/data/object/id", version = "/created" }}

[routes.orders]
sources = ["shop"]
url = "http://127.0.0.1:9000/hooks"
idempotent = true
signing_secret = "whsec_cm91dGUtc2lnbmluZy1rZXk="
timeout = "10s"
status_url = "http://127.0.0.1:9000/status/{{key}}"
max_attempts = 15
max_age = "3d"
backoff = {{ base = "1s", cap = "1h" }}
"#
    )
}

/// Runs `f` in a jail with an empty environment and a fresh working directory.
#[expect(
    clippy::result_large_err,
    reason = "figment's Jail fixes the closure's error type"
)]
fn jailed<T>(f: impl FnOnce(&mut Jail) -> T) -> T {
    let mut out = None;
    Jail::expect_with(|jail| {
        jail.clear_env();
        out = Some(f(jail));
        Ok(())
    });
    out.expect("the jail ran the closure")
}

fn load_file(jail: &Jail, toml: &str) -> anyhow::Result<Settings> {
    jail.create_file("oncebox.toml", toml)
        .expect("config file written");
    load(&Overrides::default())
}

/// The settings `toml` loads to, in a jail; panics if they are refused.
pub(crate) fn ok(toml: &str) -> Settings {
    jailed(|jail| load_file(jail, toml)).expect("configuration is valid")
}

fn err(toml: &str) -> String {
    match jailed(|jail| load_file(jail, toml)) {
        Ok(s) => panic!("configuration accepted: {s:?}"),
        Err(e) => format!("{e:#}"),
    }
}

/// A valid `[sources.shop]` with `extra` lines appended.
fn shop(extra: &str) -> String {
    format!("[sources.shop]\nsignature = \"stripe\"\nsecrets = [\"sk_one\"]\n{extra}\n")
}

fn policy<'s>(s: &'s Settings, name: &str) -> &'s SourcePolicy {
    let name = Source::new(name).expect("valid source name");
    s.gateway.sources.get(&name).expect("source configured")
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn design_example_loads() {
    let s = ok(&design_example());
    assert_eq!(s.listen, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
    assert_eq!(s.database, "sqlite://oncebox.db");
    assert!(!s.gateway.open_sources);
    assert_eq!(s.gateway.admin_token.as_deref(), Some(ADMIN_TOKEN));
    let shop = policy(&s, "shop");
    assert_eq!(shop.scheme, Scheme::StandardWebhooks);
    assert_eq!(shop.secrets.len(), 1);
    assert_eq!(shop.tolerance, Duration::from_secs(300));
    assert_eq!(shop.event_id, EventIdRule::Header("webhook-id".into()));
    assert_eq!(shop.fingerprint, FingerprintMode::Json);
    assert_eq!(shop.max_body, 1 << 20);
    assert_eq!(shop.retention, Duration::from_secs(7 * 86400));
    let order = shop.order.as_ref().expect("order guard");
    assert_eq!(order.entity, Pointer::parse("/data/object/id").unwrap());
    assert_eq!(order.version, Pointer::parse("/created").unwrap());
    let orders = s
        .gateway
        .routes
        .iter()
        .find(|r| r.name == "orders")
        .expect("route orders");
    assert_eq!(orders.url, "http://127.0.0.1:9000/hooks");
    assert!(orders.idempotent && orders.signing_secret.is_some() && orders.status_url.is_some());
    assert_eq!(orders.retry.max_attempts, 15);
    assert_eq!(orders.retry.max_age, Duration::from_secs(3 * 86400));
    assert_eq!(orders.retry.backoff.cap, Duration::from_secs(3600));
}

#[test]
fn zero_config_listens_on_loopback_with_open_sources() {
    let s = jailed(|_| load(&Overrides::default())).expect("zero-config is valid");
    assert!(s.gateway.open_sources);
    assert!(s.gateway.sources.is_empty());
    assert_eq!(s.listen, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
    assert_eq!(s.database, "sqlite://oncebox.db");
    assert_eq!(s.gateway.admin_token, None);
    assert!(s.warnings.iter().any(|w| w.contains("zero-config")));
}

#[test]
fn configured_sources_close_the_gateway() {
    let s = ok(&shop("fingerprint = \"json\""));
    assert!(!s.gateway.open_sources);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[test]
fn every_problem_is_reported_at_once() {
    let e = err(
        "listen = \"x\"\nadmin_token = \"short\"\n[sources.a]\nsignature = \"stripe\"\n\
                 [sources.b]\nsignature = \"github\"\ntolerance = \"0s\"\nsecrets = [\"k\"]\n",
    );
    assert_mentions(
        &e,
        &[
            "listen:",
            "admin_token:",
            "sources.a.secrets:",
            "sources.b.tolerance:",
        ],
    );
}

/// `[storage] placement` names where the SQLite writer and checkpointer run, from the file or
/// the environment; absent, the library's default stays; an unknown name is refused by its
/// path.
#[test]
fn storage_places_the_storage_threads() {
    use oncebox_sqlite::Placement;
    assert_eq!(ok(&shop("")).storage.placement, None);
    let s = ok(&format!(
        "{}\n[storage]\nplacement = \"anywhere\"\n",
        shop("")
    ));
    assert_eq!(s.storage.placement, Some(Placement::Anywhere));
    assert!(super::describe(&s).contains("writer and checkpointer run anywhere"));
    let s = ok(&format!(
        "{}\n[storage]\nplacement = \"disk-interrupts\"\n",
        shop("")
    ));
    assert_eq!(s.storage.placement, Some(Placement::DiskInterrupts));
    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_STORAGE__PLACEMENT", "1");
        load_file(jail, &shop(""))
    })
    .expect("valid");
    assert_eq!(s.storage.placement, Some(Placement::Cpu(1)));
    assert!(super::describe(&s).contains("kept on CPU 1"));
    assert_mentions(
        &err(&format!("{}\n[storage]\nplacement = \"cpu1\"\n", shop(""))),
        &["storage.placement:", "\"cpu1\"", "disk-interrupts"],
    );
    assert_mentions(
        &err(&format!("{}\n[storage]\nplacement = -1\n", shop(""))),
        &["storage.placement:", "a CPU number (0 or more)"],
    );
}

/// `[storage] recent_answers` sizes the SQLite memory of recent answers, from the file or the
/// environment; absent, the library's default stays; too large is refused by its path; set
/// for PostgreSQL, which keeps no such memory, it warns.
#[test]
fn storage_sizes_the_memory_of_recent_answers() {
    assert_eq!(ok(&shop("")).storage.recent_answers, None);
    let s = ok(&format!("{}\n[storage]\nrecent_answers = 0\n", shop("")));
    assert_eq!(s.storage.recent_answers, Some(0));
    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_STORAGE__RECENT_ANSWERS", "250000");
        load_file(jail, &shop(""))
    })
    .expect("valid");
    assert_eq!(s.storage.recent_answers, Some(250_000));
    assert!(super::describe(&s).contains("250000 recent answers kept in memory"));
    assert_mentions(
        &err(&format!(
            "{}\n[storage]\nrecent_answers = 20000000\n",
            shop("")
        )),
        &["storage.recent_answers:", "at most 10000000"],
    );
    assert_mentions(
        &err(&format!("{}\n[storage]\nrecent_answer = 5\n", shop(""))),
        &["recent_answer"],
    );
    let s = ok(&format!(
        "database = \"postgres://oncebox@127.0.0.1/oncebox\"\n{}\n[storage]\nrecent_answers = 5\n",
        shop("")
    ));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("storage.recent_answers")),
        "{:?}",
        s.warnings
    );
}

/// A SQLite setting behind which no file lasts (no path, as an unset variable leaves it;
/// memory; a `file:` URI or a query) or sqlx's `sqlite:` without `//` is refused under
/// `database`, with what to write instead, from the file or the environment.
#[test]
fn a_sqlite_database_without_a_lasting_file_is_refused() {
    for database in [
        "sqlite://",
        "sqlite://:memory:",
        ":memory:",
        "file:oncebox.db?mode=memory&cache=shared",
        "sqlite://oncebox.db?mode=memory",
        "sqlite:oncebox.db",
    ] {
        let e = err(&format!("database = \"{database}\"\n{}", shop("")));
        assert_mentions(
            &e,
            &["database:", "sqlite://oncebox.db", "sqlite:///abs/path.db"],
        );
    }
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_DATABASE", "sqlite://");
        load_file(jail, &shop("")).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["database:", "names no file"]);
    for database in ["sqlite://oncebox.db", "sqlite:///tmp/o.db", "oncebox.db"] {
        let s = ok(&format!("database = \"{database}\"\n{}", shop("")));
        assert_eq!(s.database, database);
    }
}

/// A retention shorter than a day is accepted with a warning, whatever the sender.
#[test]
fn a_retention_shorter_than_a_day_is_warned_about() {
    let short = ok("[sources.open]\nsignature = \"none\"\nretention = \"1h\"\n");
    assert!(
        short
            .warnings
            .iter()
            .any(|w| w.contains("source open: retention 1h is shorter than a day")),
        "{:?}",
        short.warnings
    );
    let long = ok("[sources.open]\nsignature = \"none\"\nretention = \"2days\"\n");
    assert!(
        !long
            .warnings
            .iter()
            .any(|w| w.contains("shorter than a day")),
        "{:?}",
        long.warnings
    );
}

/// A signed source whose id comes from a header its signature does not cover is warned about:
/// one signed request can be sent again under new ids. Ids the signature covers are not.
#[test]
fn an_event_id_header_the_signature_does_not_cover_is_warned_about() {
    let unsigned = |s: &Settings| {
        s.warnings
            .iter()
            .filter(|w| w.contains("is not covered by the signature"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let s = ok(&shop("event_id = { header = \"X-Request-Id\" }"));
    assert_eq!(
        unsigned(&s),
        vec![
            "source shop: event_id header \"x-request-id\" is not covered by the signature: \
             anyone holding one signed request can send it again under new ids, each taken as \
             a new event (take the id from a pointer into the signed body)"
                .to_owned()
        ]
    );
    let hooks = "[sources.hooks]\nsignature = \"standard-webhooks\"\n\
                 secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n";
    let s = ok(&format!(
        "{hooks}event_id = {{ header = \"Idempotency-Key\" }}\n"
    ));
    assert!(unsigned(&s)[0].contains("(take the id from header \"webhook-id\")"));
    for quiet in [
        shop(""),
        shop("event_id = { pointer = \"/data/id\" }"),
        shop("event_id = { derive = [\"/order\"] }"),
        format!("{hooks}event_id = {{ header = \"Webhook-Id\" }}\n"),
        hooks.to_owned(),
        "[sources.gh]\npreset = \"github\"\nsecrets = [\"s\"]\n".to_owned(),
        "[sources.open]\nsignature = \"none\"\nevent_id = { header = \"X-Id\" }\n".to_owned(),
    ] {
        assert_eq!(unsigned(&ok(&quiet)), Vec::<String>::new(), "{quiet}");
    }
}
