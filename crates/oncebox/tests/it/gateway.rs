//! The gateway as a user runs it: `oncebox check` on good and bad files (its sources and
//! routes described), `oncebox serve` with a configured source, and `oncebox send` signing
//! test events that the gateway accepts.

use crate::support::{oncebox, serve, serve_by, text};

const CONFIG: &str = r#"
listen = "127.0.0.1:0"
admin_token = "an-admin-token-of-some-length"

[sources.stripe]
preset = "stripe"
secrets = ["whsec_test_secret"]

[sources.shop]
signature = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
event_id = { header = "webhook-id" }

[sources.orders]
signature = "none"
event_id = { derive = ["/order_id", "/type"] }
"#;

/// `shop`'s key in `CONFIG`.
const SHOP_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `oncebox send stripe --id ID --body BODY --url URL` in `dir`: what it printed.
fn send_stripe(dir: &std::path::Path, url: &str, id: &str, body: &str) -> String {
    let args = ["send", "stripe", "--id", id, "--body", body, "--url", url];
    text(&oncebox(dir, &args))
}

#[test]
fn check_describes_a_good_file_and_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let ok = oncebox(dir.path(), &["check"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(
        text(&ok).contains("stripe") && !text(&ok).contains("whsec_test_secret"),
        "{}",
        text(&ok)
    );
    let bad = CONFIG.replace(
        "preset = \"stripe\"",
        "preset = \"stripe\"\ntolerance = \"5 parsecs\"",
    );
    std::fs::write(dir.path().join("oncebox.toml"), bad).unwrap();
    let out = oncebox(dir.path(), &["check"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("sources.stripe.tolerance"),
        "{}",
        text(&out)
    );
}

/// Routes are described with where they send and what a request without an answer becomes;
/// their secrets and whatever follows a URL's host (a receiver's key may be in the path, as
/// Slack's is, or under any query name) are not shown, nor a password, in text or JSON.
#[test]
fn check_describes_each_route() {
    let dir = tempfile::tempdir().unwrap();
    let routes = r#"
[routes.ledger]
sources = ["stripe"]
url = "https://ledger.internal/hooks/T0/B0/L3DGERT0KEN?code=AZUREFUNCTIONKEY&v=2"
idempotent = true
signing_secret = "whsec_bGVkZ2VyLXJvdXRlLXNpZ25pbmcta2V5LTAx"

[routes.mailer]
sources = ["shop", "orders"]
filter = { pointer = "/type", equals = "order.paid" }
url = "https://mail:hunter2@mailer.internal/send"
status_url = "https://mail:hunter2@mailer.internal/sent/ST4TUST0KEN/{key}?sig=SASSIG"
"#;
    std::fs::write(dir.path().join("oncebox.toml"), format!("{CONFIG}{routes}")).unwrap();
    let out = oncebox(dir.path(), &["check"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for expected in [
        "routes      2",
        "ledger -> https://ledger.internal/***\n",
        "sent again with the same key",
        ", signed",
        "mailer -> https://***@mailer.internal/***\n",
        "sources      shop, orders",
        "filter       /type = \"order.paid\"",
        "parked uncertain, settled by https://***@mailer.internal/***\n",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    let json = oncebox(dir.path(), &["check", "--output", "json"]);
    assert!(json.status.success(), "{}", text(&json));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        doc["routes"][0]["url"], "https://ledger.internal/***",
        "{doc}"
    );
    let said = format!("{said}{}", text(&json));
    for secret in [
        "hunter2",
        "bGVkZ2VyLXJvdXRlLXNpZ25pbmcta2V5LTAx",
        "AZUREFUNCTIONKEY",
        "SASSIG",
        // A receiver's key in the path, as Slack's, Discord's and Teams' webhooks take it.
        "L3DGERT0KEN",
        "ST4TUST0KEN",
    ] {
        assert!(!said.contains(secret), "{secret} shown: {said}");
    }
}

/// A `ca_file` whose PEM blocks hold a certificate rustls cannot read (here a body missing a
/// line, still base64) is refused by `check` under its field: the relay builds the route's
/// client with it, rustls refuses the whole set, and every delivery of the route failed.
#[test]
fn check_refuses_a_ca_file_whose_certificate_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    let lines: Vec<&str> = pem.lines().collect();
    // The header, a full 64-character line of the body, the rest: still base64 (48 bytes a
    // line), no longer a certificate.
    assert_eq!(lines[2].len(), 64, "{pem}");
    let broken = [&lines[..2], &lines[3..]].concat().join("\n");
    let config = |file: &str| {
        format!(
            "{CONFIG}\n[routes.internal]\nsources = [\"shop\"]\n\
             url = \"https://hooks.internal/in\"\nca_file = \"{file}\"\n"
        )
    };
    std::fs::write(dir.path().join("good.pem"), &pem).unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), config("good.pem")).unwrap();
    let good = oncebox(dir.path(), &["check"]);
    assert!(good.status.success(), "{}", text(&good));
    std::fs::write(dir.path().join("broken.pem"), format!("{broken}\n")).unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), config("broken.pem")).unwrap();
    let out = oncebox(dir.path(), &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("routes.internal.ca_file: broken.pem: a certificate cannot be read"),
        "{}",
        text(&out)
    );
}

/// `check` says what `oncebox consume` would run: each consumer's broker, source, key rule,
/// quarantine and pacing, in text and in JSON.
#[test]
fn check_describes_each_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let consumers = r#"
[consumers.orders]
source = "shop"
queue = "orders"
key = "message-id"
quarantine = "orders.quarantine"
prefetch = 16

[consumers.payments]
source = "stripe"
stream = "PAYMENTS"
subject = "payments.>"
key = { pointer = "/id" }
quarantine = "quarantine.payments"
retry_delay = "2s"
"#;
    std::fs::write(
        dir.path().join("oncebox.toml"),
        format!("{CONFIG}{consumers}"),
    )
    .unwrap();
    let out = oncebox(dir.path(), &["check"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for expected in [
        "consumers   2 (run by oncebox consume)",
        "orders <- RabbitMQ queue orders for source shop",
        "key          the message id",
        "quarantine   exchange orders.quarantine, routing key orders",
        "prefetch 16",
        "payments <- NATS stream PAYMENTS, subjects payments.> (durable ",
        "key          JSON /id",
        "quarantine   subject quarantine.payments",
        "2s apart",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    let json = oncebox(dir.path(), &["check", "--output", "json"]);
    assert!(json.status.success(), "{}", text(&json));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let c = &doc["consumers"];
    assert_eq!(
        (&c[0]["name"], &c[0]["broker"], &c[0]["reads"]["queue"]),
        (&"orders".into(), &"amqp".into(), &"orders".into()),
        "{doc}"
    );
    assert_eq!(
        (
            &c[1]["broker"],
            &c[1]["reads"]["stream"],
            &c[1]["retry_delay_ms"]
        ),
        (&"nats".into(), &"PAYMENTS".into(), &2000.into()),
        "{doc}"
    );
}

/// One key in two places is refused by every command that reads it, naming both places and
/// never the key: a second source with `shop`'s key written without its `whsec_` prefix, then
/// a route signing, through a variable, with `shop`'s key.
#[test]
fn a_key_shared_by_two_sources_or_a_route_and_a_source_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bare = SHOP_KEY.strip_prefix("whsec_").unwrap();
    let twin = format!(
        "{CONFIG}\n[sources.twin]\nsignature = \"standard-webhooks\"\nsecrets = [\"{bare}\"]\n"
    );
    std::fs::write(d.join("oncebox.toml"), twin).unwrap();
    for args in [&["check"][..], &["serve"], &["send", "twin"]] {
        let out = oncebox(d, args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("sources.twin.secrets") && said.contains("also one of sources.shop"),
            "{args:?}: {said}"
        );
        assert!(!said.contains(bare), "{args:?}: the key is shown: {said}");
    }
    let route = format!(
        "{CONFIG}\n[routes.back]\nsources = [\"orders\"]\nurl = \"https://example.com/in\"\n\
         signing_secret_env = \"BACK_KEY\"\n"
    );
    std::fs::write(d.join("oncebox.toml"), route).unwrap();
    for args in [&["check"][..], &["relay"]] {
        let out = crate::support::oncebox_with_env(d, &[("BACK_KEY", SHOP_KEY)], args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("routes.back: its signing secret is also a secret of sources.shop"),
            "{args:?}: {said}"
        );
        assert!(!said.contains(bare), "{args:?}: the key is shown: {said}");
    }
}

#[test]
fn send_signs_events_the_gateway_accepts_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let server = serve(dir.path());
    for source in ["stripe", "shop"] {
        let first = oncebox(
            dir.path(),
            &["send", source, "--id", "evt_cli_1", "--url", &server.1],
        );
        assert!(first.status.success(), "{source}: {}", text(&first));
        assert!(
            text(&first).starts_with("202") && !text(&first).contains("replayed"),
            "{}",
            text(&first)
        );
    }
    // Stripe counts `pending_webhooks` again for each attempt: a retry is still the event.
    let body = r#"{"id":"evt_cli_2","type":"charge.succeeded","pending_webhooks":2}"#;
    let retry = r#"{"id":"evt_cli_2","type":"charge.succeeded","pending_webhooks":1}"#;
    let a = send_stripe(dir.path(), &server.1, "evt_cli_2", body);
    let b = send_stripe(dir.path(), &server.1, "evt_cli_2", retry);
    assert!(a.starts_with("202") && b.contains("(replayed)"), "{a}\n{b}");
    // Another event under that id is still a conflict.
    let other = r#"{"id":"evt_cli_2","type":"charge.refunded","pending_webhooks":1}"#;
    let c = send_stripe(dir.path(), &server.1, "evt_cli_2", other);
    assert!(c.contains("422"), "{c}");
    let events = oncebox(
        dir.path(),
        &["events", "--source", "stripe", "--output", "json"],
    );
    let listed: serde_json::Value = serde_json::from_slice(&events.stdout).unwrap();
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["evt_cli_1", "evt_cli_2"]);
}

#[tokio::test]
async fn admin_api_answers_without_a_token_on_either_spelling_of_loopback() {
    let client = reqwest::Client::new();
    for listen in ["127.0.0.1:0", "[::ffff:127.0.0.1]:0"] {
        let dir = tempfile::tempdir().unwrap();
        let server = crate::support::serve_with(dir.path(), &["--listen", listen]);
        let stats = client
            .get(format!("{}/v1/stats", server.1))
            .send()
            .await
            .unwrap();
        // Zero-config is loopback-only, so the admin API needs no token there.
        assert_eq!(stats.status(), 200, "{listen}: {}", server.1);
        server.stop();
    }
}

#[tokio::test]
async fn a_derived_id_makes_a_fact_resent_in_a_new_envelope_one_event() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let server = serve(dir.path());
    let client = reqwest::Client::new();
    let post = |body: &'static str| {
        client
            .post(format!("{}/v1/sources/orders/events", server.1))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // The same business fact, sent again with its own timestamp: a redelivery, not a conflict.
    let first = post(r#"{"order_id":"o-7","type":"paid","sent_at":"10:00:00"}"#)
        .await
        .unwrap();
    assert_eq!(first.status(), 202);
    let again = post(r#"{"sent_at":"10:00:05","type":"paid","order_id":"o-7"}"#)
        .await
        .unwrap();
    assert_eq!(again.status(), 202, "{:?}", again.text().await);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let events = oncebox(
        dir.path(),
        &["events", "--source", "orders", "--output", "json"],
    );
    let listed: serde_json::Value = serde_json::from_slice(&events.stdout).unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    server.stop();
}

/// An upgrade across the Stripe preset's change of fingerprint: records stored when it took
/// the whole body (as `fingerprint = "json"` still does) answer the retries that reach the new
/// version as replays, compared by their stored payloads, not as another payload under their
/// key.
#[test]
fn stripe_records_fingerprinted_the_earlier_way_still_answer_their_retries() {
    let dir = tempfile::tempdir().unwrap();
    let earlier = CONFIG.replace(
        "preset = \"stripe\"\n",
        "preset = \"stripe\"\nfingerprint = \"json\"\n",
    );
    std::fs::write(dir.path().join("oncebox.toml"), &earlier).unwrap();
    let body = r#"{"id":"evt_up","type":"charge.succeeded","pending_webhooks":1}"#;
    let send = |url: &str, body: &str| send_stripe(dir.path(), url, "evt_up", body);
    let server = serve(dir.path());
    let first = send(&server.1, body);
    assert!(
        first.starts_with("202") && !first.contains("replayed"),
        "{first}"
    );
    server.stop();

    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let server = serve(dir.path());
    let retry = send(&server.1, body);
    assert!(retry.contains("(replayed)"), "{retry}");
    // Also when Stripe counted `pending_webhooks` again, which the whole body took in.
    let recounted = r#"{"id":"evt_up","type":"charge.succeeded","pending_webhooks":0}"#;
    let retry = send(&server.1, recounted);
    assert!(retry.contains("(replayed)"), "{retry}");
    let other = send(&server.1, r#"{"id":"evt_up","type":"charge.refunded"}"#);
    assert!(other.contains("422"), "{other}");
    server.stop();
}

/// A token given with `--admin-token` is taken, and `serve` warns that a command line shows it
/// to every user of the machine.
#[test]
fn an_admin_token_on_the_command_line_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), "listen = \"127.0.0.1:0\"\n").unwrap();
    let token = "a-token-on-the-command-line";
    // At the default level whatever the suite's own `RUST_LOG`.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"));
    command.env_remove("RUST_LOG");
    let server = serve_by(command, d, &["--admin-token", token, "--no-relay"]);
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("--admin-token: a command line is visible to every user"),
        "{log}"
    );
    assert!(
        !log.contains(token),
        "the token itself is never logged: {log}"
    );
    let request = reqwest::Client::new()
        .get(format!("{}/v1/events", server.1))
        .bearer_auth(token)
        .send();
    let events = tokio::runtime::Runtime::new().unwrap().block_on(request);
    assert_eq!(events.unwrap().status(), reqwest::StatusCode::OK);
}
