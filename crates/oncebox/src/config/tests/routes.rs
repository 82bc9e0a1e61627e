//! Route URLs: http(s) receivers, RabbitMQ exchanges and NATS subjects are accepted; a bad URL
//! names the part to fix; HTTP-only settings on a broker route are refused by field; broker
//! names AMQP cannot carry are refused for routes and consumers alike.

use oncebox_relay::Target;

use super::{assert_mentions, err, ok, shop};

/// `[sources.shop]` and `[routes.r]` with `url` and `extra` lines.
fn routed(url: &str, extra: &str) -> String {
    shop(&format!(
        "[routes.r]\nsources = [\"shop\"]\nurl = \"{url}\"\n{extra}\n"
    ))
}

fn target_of(url: &str) -> Target {
    let s = ok(&routed(url, ""));
    let route = s
        .gateway
        .routes
        .iter()
        .find(|r| r.name == "r")
        .expect("route r");
    assert_eq!(route.url, url, "the URL is kept as written");
    Target::parse(&route.url).expect("a validated URL parses")
}

#[test]
fn broker_urls_are_accepted_beside_http() {
    assert_eq!(target_of("https://example.com/hooks"), Target::Http);
    let Target::Amqp(a) = target_of(
        "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=orders&routing_key=paid&heartbeat=30",
    ) else {
        panic!("an AMQP target")
    };
    assert_eq!(
        (a.exchange.as_str(), a.routing_key.as_str()),
        ("orders", "paid")
    );
    // The default exchange, addressed to a queue by name.
    let Target::Amqp(q) = target_of("amqp://127.0.0.1/%2f?exchange=&routing_key=orders") else {
        panic!("an AMQP target")
    };
    assert_eq!(
        (q.exchange.as_str(), q.routing_key.as_str()),
        ("", "orders")
    );
    let Target::Nats(n) = target_of("nats://127.0.0.1:4222?subject=orders.paid") else {
        panic!("a NATS target")
    };
    assert_eq!(n.subject, "orders.paid");
}

#[test]
fn a_missing_or_unknown_url_is_refused_by_field() {
    let e = err(&shop("[routes.r]\nsources = [\"shop\"]\n"));
    assert_mentions(&e, &["routes.r.url", "is required"]);
    let e = err(&routed("ftp://example.com/x", ""));
    assert_mentions(&e, &["routes.r.url", "\"ftp\"", "amqp://", "nats://"]);
    let e = err(&routed("not a url", ""));
    assert_mentions(&e, &["routes.r.url", "not a URL"]);
}

#[test]
fn amqp_urls_need_an_exchange_and_take_no_stray_parameters() {
    for (url, says) in [
        ("amqp://127.0.0.1/%2f", "needs the query parameter exchange"),
        ("amqp://127.0.0.1/%2f?exchange=", "routing_key"),
        ("amqp://127.0.0.1/%2f?exchange=a&exchange=b", "given twice"),
        (
            "amqp://127.0.0.1/%2f?exchange=a&queue=q",
            "unknown query parameter \"queue\"",
        ),
    ] {
        assert_mentions(&err(&routed(url, "")), &["routes.r.url", says]);
    }
}

#[test]
fn nats_urls_need_a_publishable_subject() {
    for (url, says) in [
        ("nats://127.0.0.1:4222", "needs the query parameter subject"),
        ("nats://127.0.0.1:4222?subject=orders.*", "wildcards"),
        ("nats://127.0.0.1:4222?subject=orders..paid", "empty token"),
        (
            "nats://127.0.0.1:4222?subject=a&stream=s",
            "unknown query parameter \"stream\"",
        ),
    ] {
        assert_mentions(&err(&routed(url, "")), &["routes.r.url", says]);
    }
}

#[test]
fn http_only_settings_are_refused_on_broker_routes() {
    let amqp = "amqp://127.0.0.1/%2f?exchange=orders&routing_key=paid";
    let e = err(&routed(
        amqp,
        "signing_secret = \"whsec_cm91dGUtc2lnbmluZy1rZXk=\"",
    ));
    assert_mentions(&e, &["routes.r.signing_secret", "only to http(s) routes"]);
    assert!(!e.contains("whsec_"), "the secret is never echoed: {e}");
    let e = err(&routed(amqp, "signing_secret_env = \"UNSET_SECRET\""));
    assert_mentions(
        &e,
        &["routes.r.signing_secret_env", "only to http(s) routes"],
    );
    assert!(!e.contains("is not set"), "one message, not two: {e}");
    let nats = "nats://127.0.0.1:4222?subject=orders.paid";
    let e = err(&routed(
        nats,
        "status_url = \"http://127.0.0.1:9000/s/{key}\"",
    ));
    assert_mentions(&e, &["routes.r.status_url", "only to http(s) routes"]);
    // The same settings stay valid on an HTTP route.
    ok(&routed(
        "http://127.0.0.1:9000/hooks",
        "signing_secret = \"whsec_cm91dGUtc2lnbmluZy1rZXk=\"\nstatus_url = \"http://127.0.0.1:9000/s/{key}\"",
    ));
}

/// A route names the sources configured: one whose settings are refused is reported under its
/// own path only, not a second time as a source the route cannot find.
#[test]
fn a_refused_source_is_not_also_missing_from_its_routes() {
    let route = "[routes.orders]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9000/hooks\"\n";
    let e = err(&shop(&format!("tolerance = \"0s\"\n{route}")));
    assert_mentions(&e, &["sources.shop.tolerance"]);
    assert!(!e.contains("no source named"), "{e}");
    let e = err(&shop(
        &route.replace("[\"shop\"]", "[\"shop\", \"nosuch\"]"),
    ));
    assert_mentions(&e, &["routes.orders.sources", "no source named \"nosuch\""]);
}

#[test]
fn a_routes_authorities_are_read_from_a_pem_file_and_refused_by_field_when_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    let good = dir.path().join("ca.pem");
    std::fs::write(&good, &pem).unwrap();
    let s = ok(&routed(
        "https://hooks.internal/in",
        &format!("ca_file = {:?}", good.display().to_string()),
    ));
    let route = s.gateway.routes.iter().find(|r| r.name == "r").unwrap();
    assert_eq!(route.ca_pem.as_deref(), Some(pem.as_bytes()));
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    // PEM blocks whose certificate rustls cannot read: the body without one of its lines,
    // still base64. The relay's client would refuse it, and with it every delivery.
    let lines: Vec<&str> = pem.lines().collect();
    let broken = dir.path().join("broken.pem");
    std::fs::write(&broken, [&lines[..2], &lines[3..]].concat().join("\n")).unwrap();
    for (file, says) in [
        (&empty, "holds no PEM certificate"),
        (&missing, "cannot read"),
        (&broken, "a certificate cannot be read"),
    ] {
        let line = format!("ca_file = {:?}", file.display().to_string());
        let e = err(&routed("https://hooks.internal/in", &line));
        assert_mentions(&e, &["routes.r.ca_file", says]);
    }
    let line = format!("ca_file = {:?}", good.display().to_string());
    // A NATS route's own authorities, over TLS; RabbitMQ routes have no TLS here.
    for url in [
        "nats://127.0.0.1:4222?subject=orders",
        "tls://127.0.0.1:4222?subject=orders",
    ] {
        let s = ok(&routed(url, &line));
        let route = s.gateway.routes.iter().find(|r| r.name == "r").unwrap();
        assert_eq!(route.ca_pem.as_deref(), Some(pem.as_bytes()), "{url}");
    }
    let e = err(&routed("amqp://127.0.0.1:5672/%2f?exchange=orders", &line));
    assert_mentions(&e, &["routes.r.ca_file", "https and NATS"]);
    // Plain http has no TLS to verify, unless the status URL is https.
    let e = err(&routed("http://hooks.internal/in", &line));
    assert_mentions(&e, &["routes.r.ca_file", "plain http"]);
    let status = "status_url = \"https://hooks.internal/status/{key}\"";
    let s = ok(&routed(
        "http://hooks.internal/in",
        &format!("{line}\n{status}"),
    ));
    let route = s.gateway.routes.iter().find(|r| r.name == "r").unwrap();
    assert_eq!(
        route.ca_pem.as_deref(),
        Some(pem.as_bytes()),
        "for its status URL"
    );
}

#[test]
fn names_longer_than_amqp_carries_are_refused() {
    let long = "x".repeat(256);
    let e = err(&routed(&format!("amqp://127.0.0.1/{long}?exchange=e"), ""));
    assert_mentions(&e, &["routes.r.url", "vhost", "longer than 255 bytes"]);
    let consumer = |queue: &str, quarantine: &str| {
        format!(
            "[consumers.c]\nsource = \"s\"\nkey = \"message-id\"\nqueue = \"{queue}\"\n\
             quarantine = \"{quarantine}\"\n"
        )
    };
    let fits = &long[1..];
    ok(&consumer(fits, fits));
    assert_mentions(
        &err(&consumer(&long, "x")),
        &["consumers.c.queue", "255 bytes"],
    );
    assert_mentions(
        &err(&consumer("q", &long)),
        &["consumers.c.quarantine", "255 bytes"],
    );
}

/// One answer of a status URL without the key in it would settle every uncertain delivery of
/// the route; a key only in the fragment is never sent.
#[test]
fn a_status_url_must_carry_the_key_where_it_is_sent() {
    let http = "http://127.0.0.1:9000/hooks";
    for status in [
        "http://127.0.0.1:9000/status",
        "http://127.0.0.1:9000/status#{key}",
        "ftp://127.0.0.1/{key}",
    ] {
        let e = err(&routed(http, &format!("status_url = \"{status}\"")));
        assert_mentions(&e, &["routes.r.status_url"]);
    }
    let e = err(&routed(http, "status_url = \"http://h/status\""));
    assert_mentions(&e, &["must contain {key}"]);
    for status in [
        "http://127.0.0.1:9000/status/{key}",
        "https://h.example/status?key={key}#top",
    ] {
        ok(&routed(http, &format!("status_url = \"{status}\"")));
    }
}

/// A route's signing key is ours and receivers trust what it signs: one shorter than 16
/// bytes (decoded) is refused by field, inline or from the environment, and never echoed. A
/// source's key is its sender's choice and stays accepted however short.
#[test]
fn a_short_route_signing_secret_is_refused_but_a_short_source_secret_is_not() {
    for secret in ["abc", "whsec_abc", "whsec_MDEyMzQ1Njc4OWFiY2Rl"] {
        let e = err(&routed(
            "http://127.0.0.1:9000/hooks",
            &format!("signing_secret = \"{secret}\""),
        ));
        assert_mentions(&e, &["routes.r.signing_secret", "at least 16 bytes"]);
        assert!(!e.contains(secret), "{e}");
    }
    let e = super::jailed(|jail| {
        jail.set_env("ROUTE_KEY", "whsec_abc");
        super::load_file(
            jail,
            &routed(
                "http://127.0.0.1:9000/hooks",
                "signing_secret_env = \"ROUTE_KEY\"",
            ),
        )
        .map(|_| ())
        .unwrap_err()
    });
    assert_mentions(
        &format!("{e:#}"),
        &["routes.r.signing_secret_env", "at least 16 bytes"],
    );
    // 16 bytes exactly: `0123456789abcdef`.
    ok(&routed(
        "http://127.0.0.1:9000/hooks",
        "signing_secret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"",
    ));
    ok("[sources.shop]\npreset = \"standard-webhooks\"\nsecrets = [\"whsec_abc\"]\n");
}

#[test]
fn a_routes_rate_is_read_in_three_units_and_refused_by_field_when_malformed() {
    let s = ok(&routed("https://example.com/hooks", "rate = \"600/min\""));
    let rate = s.gateway.routes[0].rate.expect("a rate");
    assert_eq!((rate.requests, rate.per.as_secs()), (600, 60));
    assert_eq!(
        ok(&routed("https://example.com/hooks", "")).gateway.routes[0].rate,
        None
    );
    // Brokers are paced alike.
    let s = ok(&routed(
        "nats://127.0.0.1:4222?subject=orders",
        "rate = \"5/s\"",
    ));
    assert_eq!(s.gateway.routes[0].rate.map(|r| r.requests), Some(5));
    for (bad, says) in [
        ("\"50\"", "\"50/s\", \"600/min\" or \"100/h\""),
        ("\"50/day\"", "\"50/s\", \"600/min\" or \"100/h\""),
        ("\"0/s\"", "from 1 to 1000000"),
        ("\"5000000/s\"", "from 1 to 1000000"),
    ] {
        let e = err(&routed(
            "https://example.com/hooks",
            &format!("rate = {bad}"),
        ));
        assert_mentions(&e, &["routes.r.rate", says]);
    }
}

/// Left out, `max_attempts` is as many as the route's `max_age` needs to end the retries
/// (the backoff's ceilings add up to three times the age); set so low that the attempts are
/// spent long before the age, `check` warns and says so.
#[test]
fn max_attempts_left_out_lets_the_age_decide_and_too_few_are_warned_of() {
    let retry = |extra: &str| {
        let s = ok(&routed("https://example.com/hooks", extra));
        let warned: Vec<String> = s
            .warnings
            .iter()
            .filter(|w| w.contains("max_attempts"))
            .cloned()
            .collect();
        (s.gateway.routes[0].retry, warned)
    };
    let (p, warned) = retry("");
    assert_eq!((p.max_attempts, p.max_age.as_secs()), (228, 3 * 86400));
    assert!(warned.is_empty(), "{warned:?}");
    // 1 s doubling to 60 s: 6 waits up to 32 s (63 s), then 60 s each; 3 h is 10 800 s.
    let (p, warned) = retry("max_age = \"1h\"\nbackoff = { base = \"1s\", cap = \"60s\" }");
    assert_eq!(p.max_attempts, 6 + (3 * 3600 - 63_u32).div_ceil(60) + 1);
    assert!(warned.is_empty(), "{warned:?}");
    // A cap so small that the most attempts given do not reach the age: the cap is named.
    let (p, _) = retry("backoff = { base = \"1s\", cap = \"10s\" }");
    assert_eq!(p.max_attempts, oncebox_core::delivery::MOST_ATTEMPTS);
    let s = ok(&routed(
        "https://example.com/hooks",
        "backoff = { base = \"1s\", cap = \"10s\" }",
    ));
    assert_mentions(
        &s.warnings.concat(),
        &[
            "routes.r.backoff.cap",
            "even 10000 attempts",
            "raise the cap",
        ],
    );
    let (p, warned) = retry("max_attempts = 15\nmax_age = \"3d\"");
    assert_eq!(p.max_attempts, 15);
    assert_mentions(
        &warned.concat(),
        &[
            "routes.r.max_attempts",
            "15 attempts",
            "3h 8m 15s",
            "max_age (3days)",
        ],
    );
}
