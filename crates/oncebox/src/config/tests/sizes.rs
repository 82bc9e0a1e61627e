//! Sizes, fingerprints and limits: each refused past sense with its field's path, each mapped
//! onto the gateway as written.

use std::time::Duration;

use oncebox_core::FingerprintMode;
use oncebox_core::json::Pointer;

use super::super::raw::parse_size;
use super::{assert_mentions, err, ok, policy, shop};

#[test]
fn fingerprint_modes() {
    let fp = |line: &str| policy(&ok(&shop(line)), "shop").fingerprint.clone();
    assert_eq!(fp(""), FingerprintMode::Json);
    assert_eq!(fp("fingerprint = \"raw\""), FingerprintMode::Raw);
    assert_eq!(
        fp("fingerprint = { fields = [\"/account_id\", \"/amount\"] }"),
        FingerprintMode::Fields(vec![
            Pointer::parse("/account_id").unwrap(),
            Pointer::parse("/amount").unwrap(),
        ])
    );
    // Beside a derived id the default is the id's own fields, on sources and consumers alike;
    // a fingerprint set by name still wins.
    let derive = "event_id = { derive = [\"/order\", \"/type\"] }";
    let fields = FingerprintMode::Fields(vec![
        Pointer::parse("/order").unwrap(),
        Pointer::parse("/type").unwrap(),
    ]);
    assert_eq!(fp(derive), fields);
    assert_eq!(
        fp(&format!("{derive}\nfingerprint = \"json\"")),
        FingerprintMode::Json
    );
    let consumer = "[consumers.c]\nsource = \"s\"\nqueue = \"q\"\nquarantine = \"x\"\n";
    let s = ok(&format!(
        "{consumer}key = {{ derive = [\"/order\", \"/type\"] }}\n"
    ));
    assert_eq!(s.consumers[0].rules.fingerprint, fields);
    let s = ok(&format!("{consumer}key = {{ pointer = \"/order\" }}\n"));
    assert_eq!(s.consumers[0].rules.fingerprint, FingerprintMode::Json);
    let e = err(&shop("fingerprint = \"xml\""));
    assert_mentions(&e, &["sources.shop.fingerprint", "xml"]);
    let e = err(&shop("fingerprint = { field = [\"/a\"] }"));
    assert_mentions(&e, &["sources.shop.fingerprint.field", "unknown key"]);
    let e = err(&shop("fingerprint = { fields = [\"a\"] }"));
    assert_mentions(&e, &["sources.shop.fingerprint.fields[0]"]);
}

#[test]
fn max_body_sizes() {
    let max = |line: &str| policy(&ok(&shop(line)), "shop").max_body;
    assert_eq!(max(""), 1 << 20);
    assert_eq!(max("max_body = \"512KiB\""), 512 << 10);
    assert_eq!(max("max_body = \"10MB\""), 10_000_000);
    assert_eq!(max("max_body = \"64MiB\""), 64 << 20);
    assert_eq!(max("max_body = 4096"), 4096);
    for bad in [
        "\"0\"",
        "0",
        "\"65MiB\"",
        "\"1TiB\"",
        "\"-1\"",
        "-1",
        "\"1.5MiB\"",
    ] {
        let e = err(&shop(&format!("max_body = {bad}")));
        assert_mentions(&e, &["sources.shop.max_body"]);
    }
}

#[test]
fn size_parser() {
    assert_eq!(parse_size("1MiB"), Some(1 << 20));
    assert_eq!(parse_size("1 mib"), Some(1 << 20));
    assert_eq!(parse_size("2KB"), Some(2000));
    assert_eq!(parse_size("7"), Some(7));
    assert_eq!(parse_size("7B"), Some(7));
    assert_eq!(parse_size("1GiB"), Some(1 << 30));
    for bad in [
        "",
        "MiB",
        "1 MiBs",
        "1.0MiB",
        "99999999999999999999",
        "18446744073709551615GiB",
        "١MiB",
    ] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
}

#[test]
fn limits_map_onto_the_gateway() {
    let s = ok(
        "[limits]\nconcurrency = 8\nconnections = 20\nbodies_per_peer = 0\n\
         header_timeout = \"2s\"\nbody_timeout = \"1m\"\nshutdown_grace = \"0s\"\n\
         retry_after = \"5s\"\n",
    );
    let l = &s.gateway.limits;
    assert_eq!(l.concurrency, 8);
    assert_eq!(l.connections, 20);
    assert_eq!(l.bodies_per_peer, 0);
    assert_eq!(l.header_timeout, Duration::from_secs(2));
    assert_eq!(l.body_timeout, Duration::from_secs(60));
    assert_eq!(l.shutdown_grace, Duration::ZERO);
    assert_eq!(l.retry_after, Duration::from_secs(5));
    let e = err(
        "[limits]\nconcurrency = 0\nconnections = 0\nheader_timeout = \"0s\"\n\
         retry_after = \"100ms\"\n",
    );
    assert_mentions(
        &e,
        &[
            "limits.concurrency",
            "limits.connections",
            "limits.header_timeout",
            "limits.retry_after",
        ],
    );
}

/// Values past any sense are refused by name rather than taken: a concurrency a semaphore
/// cannot count, or a duration that overflows the clock it is added to, would panic later.
#[test]
fn limits_past_any_sense_are_refused() {
    let e = err("[limits]\nconcurrency = 9223372036854775807\n");
    assert_mentions(&e, &["limits.concurrency", "must be from 1 to 1000000"]);
    let e = err(
        "[sources.shop]\nsignature = \"none\"\n\n[routes.r]\nsources = [\"shop\"]\n\
         url = \"http://127.0.0.1:9/hook\"\nconcurrency = 9223372036854775807\n",
    );
    assert_mentions(&e, &["routes.r.concurrency", "must be from 1 to 1000000"]);
    let e = err(
        "[sources.shop]\nsignature = \"none\"\n\n[routes.r]\nsources = [\"shop\"]\n\
         url = \"http://127.0.0.1:9/hook\"\ntimeout = \"300000000000y\"\n",
    );
    assert_mentions(&e, &["routes.r.timeout", "longer than 100 years"]);
    let s = ok("[limits]\nconcurrency = 1000000\nbody_timeout = \"100y\"\n");
    assert_eq!(s.gateway.limits.concurrency, 1_000_000);
}
