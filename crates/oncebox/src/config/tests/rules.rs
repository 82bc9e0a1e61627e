//! One test per validation rule: each bad setting is refused with its field's path.

use std::net::SocketAddr;
use std::time::Duration;

use oncebox_core::FingerprintMode;
use oncebox_core::json::Pointer;
use oncebox_core::signature::{Encoding, Scheme};
use oncebox_gateway::policy::EventIdRule;

use super::{assert_mentions, err, ok, policy, shop};

#[test]
fn signature_without_secrets_is_refused() {
    let e = err("[sources.shop]\nsignature = \"stripe\"\n");
    assert_mentions(
        &e,
        &["sources.shop.secrets", "required for signature \"stripe\""],
    );
    let e = err("[sources.shop]\npreset = \"github\"\nsecrets = []\n");
    assert_mentions(&e, &["sources.shop.secrets", "\"github\""]);
}

#[test]
fn signature_none_is_a_warning_and_takes_no_secret() {
    let s = ok("[sources.open]\nsignature = \"none\"\n");
    assert_eq!(policy(&s, "open").scheme, Scheme::None);
    assert!(
        s.warnings
            .contains(&"source open: signature none accepts unsigned events".to_owned()),
        "{:?}",
        s.warnings
    );
    let e = err("[sources.open]\nsignature = \"none\"\nsecrets = [\"x\"]\n");
    assert_mentions(&e, &["sources.open.secrets", "takes no secrets"]);
}

#[test]
fn a_source_must_name_its_signature() {
    let e = err("[sources.shop]\nsecrets = [\"x\"]\n");
    assert_mentions(&e, &["sources.shop.signature", "required"]);
}

#[test]
fn retention_shorter_than_the_preset_horizon_is_refused() {
    let e = err("[sources.pay]\npreset = \"stripe\"\nsecrets = [\"sk\"]\nretention = \"2d\"");
    assert_mentions(&e, &["sources.pay.retention", "stripe", "3days"]);
    // Without a preset the horizon is only likely (other senders sign the same way): one day
    // is the operator's call, with a warning.
    let s = ok(&shop("retention = \"1d\""));
    assert_eq!(policy(&s, "shop").retention, Duration::from_secs(86400));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("source shop: retention 1day")
                && w.contains("3days that stripe senders")),
        "{:?}",
        s.warnings
    );
    let s = ok(&shop("retention = \"3d\"\nfingerprint = \"json\""));
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let e = err(&shop("retention = \"0s\""));
    assert_mentions(&e, &["sources.shop.retention", "more than 0"]);
}

#[test]
fn tolerance_must_be_positive_and_at_most_a_day() {
    for bad in ["0s", "25h"] {
        let e = err(&shop(&format!("tolerance = \"{bad}\"")));
        assert_mentions(&e, &["sources.shop.tolerance", "at most 1 day"]);
    }
    let e = err(&shop("tolerance = \"5 parsecs\""));
    assert_mentions(
        &e,
        &[r#"sources.shop.tolerance: invalid duration "5 parsecs""#],
    );
    assert_eq!(
        policy(&ok(&shop("tolerance = \"1d\"")), "shop").tolerance,
        Duration::from_secs(86400)
    );
}

#[test]
fn listen_must_be_a_socket_address() {
    let e = err("listen = \"localhost:http\"\n");
    assert_mentions(&e, &["listen: invalid socket address \"localhost:http\""]);
}

#[test]
fn network_listener_without_sources_is_refused() {
    let e = err("listen = \"0.0.0.0:8080\"\n");
    assert_mentions(
        &e,
        &[
            "listen",
            "refusing to accept unsigned events from the network",
        ],
    );
    let e = err("listen = \"[::]:8080\"\n");
    assert_mentions(&e, &["refusing"]);
    let s = ok(&format!("listen = \"0.0.0.0:8080\"\n{}", shop("")));
    assert_eq!(s.listen, "0.0.0.0:8080".parse::<SocketAddr>().unwrap());
    ok("listen = \"[::1]:9000\"\n");
}

#[test]
fn short_admin_token_is_refused_without_echoing_it() {
    let e = err("admin_token = \"short-secret\"\n");
    assert_mentions(&e, &["admin_token", "at least 16"]);
    assert!(!e.contains("short-secret"), "{e}");
    // Of the wrong type, the value is not echoed either.
    let e = err("admin_token = 987654321987654321\n");
    assert_mentions(&e, &["admin_token", "not shown"]);
    assert!(!e.contains("987654321"), "{e}");
    // A token no `Authorization` header can carry is refused, not accepted and then unusable.
    for bad in [
        " leading-space-token",
        "token with spaces in it",
        "tökén-non-ascii-123",
    ] {
        let e = err(&format!("admin_token = \"{bad}\"\n"));
        assert_mentions(&e, &["admin_token", "visible ASCII"]);
        assert!(!e.contains(bad.trim()), "{e}");
    }
}

#[test]
fn bad_source_names_are_refused_by_key() {
    let e = err("[sources.Shop]\nsignature = \"none\"\n");
    assert_mentions(&e, &["sources.Shop: invalid source name"]);
    let e = err("[sources.\"a b\"]\nsignature = \"none\"\n");
    assert_mentions(&e, &["sources.\"a b\""]);
}

#[test]
fn hmac_sha256_needs_a_header_and_owns_its_options() {
    let s = ok(
        "[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"X-Acme-Signature\"\n\
         encoding = \"base64\"\nprefix = \"sha256=\"\nsecrets = [\"k\"]\n",
    );
    assert_eq!(
        policy(&s, "acme").scheme,
        Scheme::HmacSha256 {
            header: "x-acme-signature".into(),
            encoding: Encoding::Base64,
            prefix: "sha256=".into(),
        }
    );
    let s =
        ok("[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"x-sig\"\nsecrets = [\"k\"]\n");
    assert!(matches!(
        &policy(&s, "acme").scheme,
        Scheme::HmacSha256 { encoding: Encoding::Hex, prefix, .. } if prefix.is_empty()
    ));
    let e = err("[sources.acme]\nsignature = \"hmac-sha256\"\nsecrets = [\"k\"]\n");
    assert_mentions(&e, &["sources.acme.header", "required"]);
    let e = err(
        "[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"x-sig\"\n\
         prefix = \"sha256=\\n\"\nsecrets = [\"k\"]\n",
    );
    assert_mentions(&e, &["sources.acme.prefix", "control character"]);
    let e = err(&shop("header = \"x-sig\""));
    assert_mentions(
        &e,
        &[
            "sources.shop.header",
            "only used with signature \"hmac-sha256\"",
        ],
    );
    let e =
        err("[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"x sig\"\nsecrets = [\"k\"]\n");
    assert_mentions(&e, &["sources.acme.header", "not a valid header name"]);
    let e = err(&shop("encoding = \"base32\""));
    assert_mentions(&e, &["sources.shop.encoding", "base32"]);
}

#[test]
fn event_id_takes_exactly_one_rule() {
    let s = ok(&shop("event_id = { pointer = \"/data/id\" }"));
    assert_eq!(
        policy(&s, "shop").event_id,
        EventIdRule::Pointer(Pointer::parse("/data/id").unwrap())
    );
    let s = ok(&shop("event_id = { derive = [\"/order_id\", \"/type\"] }"));
    assert!(matches!(&policy(&s, "shop").event_id, EventIdRule::Derive(f) if f.len() == 2));
    let s = ok(&shop("event_id = { header = \"X-Request-Id\" }"));
    assert_eq!(
        policy(&s, "shop").event_id,
        EventIdRule::Header("x-request-id".into())
    );
    // Unset, a signed source reads its id only from what its signature covers: never from
    // `Idempotency-Key`, which no scheme signs (a captured request replayed under new ids would
    // be new events). Stripe signs the body, Standard Webhooks the webhook-id header; a plain
    // HMAC signs the body; GitHub's id is its delivery header, as its preset has it.
    let id = Pointer::parse("/id").unwrap();
    let unset = |signature: &str, secret: &str| {
        let header = if signature == "hmac-sha256" {
            "header = \"x-sig\"\n"
        } else {
            ""
        };
        let toml =
            format!("[sources.s]\nsignature = \"{signature}\"\nsecrets = [\"{secret}\"]\n{header}");
        policy(&ok(&toml), "s").event_id.clone()
    };
    assert_eq!(unset("stripe", "sk_one"), EventIdRule::Pointer(id.clone()));
    assert_eq!(
        unset(
            "standard-webhooks",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        ),
        EventIdRule::Header("webhook-id".into())
    );
    assert_eq!(unset("hmac-sha256", "k"), EventIdRule::Pointer(id));
    assert_eq!(
        unset("github", "k"),
        EventIdRule::Header("x-github-delivery".into())
    );
    // Unsigned, anything goes: the headers first, then `/id`.
    let none = ok("[sources.open]\nsignature = \"none\"\n");
    assert_eq!(policy(&none, "open").event_id, EventIdRule::Default);

    let e = err(&shop("event_id = { header = \"a\", pointer = \"/id\" }"));
    assert_mentions(&e, &["sources.shop.event_id", "exactly one"]);
    let e = err(&shop("event_id = {}"));
    assert_mentions(&e, &["sources.shop.event_id", "exactly one"]);
    let e = err(&shop("event_id = { pointer = \"id\" }"));
    assert_mentions(
        &e,
        &[
            "sources.shop.event_id.pointer",
            "invalid JSON pointer \"id\"",
        ],
    );
    let e = err(&shop("event_id = { derive = [] }"));
    assert_mentions(&e, &["sources.shop.event_id.derive", "at least one"]);
    let e = err(&shop("event_id = { derive = [\"/a\", \"b\"] }"));
    assert_mentions(&e, &["sources.shop.event_id.derive[1]"]);
}

/// An id derived from the whole body (the empty pointer) is the content-hash key: allowed,
/// with a warning naming the field, on sources and consumers alike; fields inside the body
/// give none.
#[test]
fn an_id_derived_from_the_whole_body_is_a_warning() {
    let named = |s: &crate::config::Settings, field: &str| {
        s.warnings
            .iter()
            .any(|w| w.starts_with(field) && w.contains("two genuine events"))
    };
    let s = ok(&shop("event_id = { derive = [\"/type\", \"\"] }"));
    assert!(
        named(&s, "sources.shop.event_id.derive[1]"),
        "{:?}",
        s.warnings
    );
    let consumer = "[consumers.c]\nsource = \"s\"\nqueue = \"q\"\nquarantine = \"x\"\n";
    let s = ok(&format!("{consumer}key = {{ derive = [\"\"] }}\n"));
    assert!(named(&s, "consumers.c.key.derive[0]"), "{:?}", s.warnings);
    let s = ok(&shop("event_id = { derive = [\"/order_id\", \"/type\"] }"));
    assert!(
        !s.warnings.iter().any(|w| w.contains("whole body")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn presets_fill_defaults_and_explicit_settings_win() {
    let s = ok("[sources.pay]\npreset = \"stripe\"\nsecrets = [\"sk\"]\n\
                [sources.gh]\npreset = \"github\"\nsecrets = [\"gh\"]\n\
                [sources.sw]\npreset = \"standard-webhooks\"\nsecrets = [\"whsec_c2VjcmV0\"]\n");
    let pay = policy(&s, "pay");
    assert_eq!(pay.scheme, Scheme::Stripe);
    assert_eq!(
        pay.event_id,
        EventIdRule::Pointer(Pointer::parse("/id").unwrap())
    );
    assert_eq!(pay.tolerance, Duration::from_secs(300));
    assert_eq!(pay.retention, Duration::from_secs(7 * 86400));
    // What a Stripe event is, not the envelope Stripe renders again for each attempt.
    let fields = ["/type", "/created", "/data", "/livemode", "/account"];
    let fields = fields.map(|f| Pointer::parse(f).unwrap()).to_vec();
    assert_eq!(pay.fingerprint, FingerprintMode::Fields(fields));
    let gh = policy(&s, "gh");
    assert_eq!(gh.fingerprint, FingerprintMode::Json);
    assert_eq!(gh.scheme, Scheme::Github);
    assert_eq!(gh.event_id, EventIdRule::Header("x-github-delivery".into()));
    let sw = policy(&s, "sw");
    assert_eq!(sw.scheme, Scheme::StandardWebhooks);
    assert_eq!(sw.event_id, EventIdRule::Header("webhook-id".into()));

    let s = ok(
        "[sources.pay]\npreset = \"stripe\"\nsecrets = [\"sk\"]\ntolerance = \"10m\"\n\
                event_id = { header = \"x-id\" }\nretention = \"3d\"\nfingerprint = \"json\"\n",
    );
    let pay = policy(&s, "pay");
    assert_eq!(pay.fingerprint, FingerprintMode::Json);
    assert_eq!(pay.scheme, Scheme::Stripe);
    assert_eq!(pay.tolerance, Duration::from_secs(600));
    assert_eq!(pay.event_id, EventIdRule::Header("x-id".into()));
    assert_eq!(pay.retention, Duration::from_secs(3 * 86400));
    let s = ok("[sources.pay]\npreset = \"stripe\"\nsignature = \"none\"\n");
    assert_eq!(policy(&s, "pay").scheme, Scheme::None);

    let e = err("[sources.pay]\npreset = \"paypal\"\n");
    assert_mentions(&e, &["sources.pay.preset", "paypal"]);
}

#[test]
fn unknown_keys_are_refused_by_path() {
    let e = err("listn = \"127.0.0.1:1\"\n");
    assert_mentions(&e, &["listn: unknown key"]);
    let e = err(&shop("tolerans = \"5m\""));
    assert_mentions(&e, &["sources.shop.tolerans: unknown key"]);
    let e = err(&shop("event_id = { headr = \"x\" }"));
    assert_mentions(&e, &["sources.shop.event_id.headr: unknown key"]);
    let e = err("[limits]\nconcurency = 3\n");
    assert_mentions(&e, &["limits.concurency: unknown key"]);
    let e = err(&shop("order = { entity = \"/id\" }"));
    assert_mentions(&e, &["sources.shop.order.version: required"]);
}

#[test]
fn a_consumer_of_a_source_nobody_configured_is_a_warning() {
    let consumer = "[consumers.c]\nqueue = \"q\"\nkey = \"message-id\"\nquarantine = \"x\"\n";
    let warned = |s: &super::super::Settings| {
        s.warnings
            .iter()
            .any(|w| w.starts_with("consumers.c.source: no [sources.shpo]"))
    };
    let typo = ok(&format!(
        "[sources.shop]\nsignature = \"none\"\n{consumer}source = \"shpo\"\n"
    ));
    assert!(warned(&typo), "{:?}", typo.warnings);
    let right = ok(&format!(
        "[sources.shop]\nsignature = \"none\"\n{consumer}source = \"shop\"\n"
    ));
    assert!(
        !right.warnings.iter().any(|w| w.starts_with("consumers.")),
        "{:?}",
        right.warnings
    );
    // Zero-config: every source is open, so nothing is unconfigured.
    let open = ok(&format!("{consumer}source = \"shpo\"\n"));
    assert!(!warned(&open), "{:?}", open.warnings);
}
