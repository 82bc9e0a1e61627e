//! Settings that load but could never work are refused at start, by field: pointers to the
//! whole body, a sub-second tolerance, unprintable route names, the documentation's example
//! admin token, and a `./oncebox.toml` that is there but no file.

use oncebox_core::signature::Scheme;

use super::{Overrides, assert_mentions, err, jailed, load, load_file, ok, shop};

#[test]
fn a_pointer_to_the_whole_body_is_refused_where_one_value_is_meant() {
    let whole = "the empty pointer names the whole body";
    let e = err(&shop("event_id = { pointer = \"\" }"));
    assert_mentions(&e, &["sources.shop.event_id.pointer", whole]);
    let e = err(&shop("order = { entity = \"\", version = \"/created\" }"));
    assert_mentions(&e, &["sources.shop.order.entity", whole]);
    let e = err(&shop("order = { entity = \"/id\", version = \"\" }"));
    assert_mentions(&e, &["sources.shop.order.version", whole]);
    let e = err(&shop(
        "order = { type = \"\", entity = \"/id\", version = \"/v\" }",
    ));
    assert_mentions(&e, &["sources.shop.order.type", whole]);
    let typed = ok(&shop(
        "order = { type = \"/data/object/object\", entity = \"/id\", version = \"/v\" }",
    ));
    let order = super::policy(&typed, "shop")
        .order
        .clone()
        .expect("order guard");
    assert_eq!(
        order.kind.map(|k| k.to_string()).as_deref(),
        Some("/data/object/object")
    );
    let consumer = "[consumers.c]\nsource = \"s\"\nkey = { pointer = \"\" }\nqueue = \"q\"\n";
    assert_mentions(&err(consumer), &["consumers.c.key.pointer", whole]);
    // A route's filter: no scalar equals the whole body, so it would deliver nothing.
    let e = err(&shop(
        "[routes.r]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9/h\"\n\
         filter = { pointer = \"\", equals = \"paid\" }",
    ));
    assert_mentions(&e, &["routes.r.filter.pointer", whole]);
    // A fingerprint over the whole body is what `json` does anyway: allowed.
    ok(&shop("fingerprint = { fields = [\"\"] }"));
}

/// The admin token earlier documentation showed as an example is refused: anyone can read it.
#[test]
fn the_documentations_example_admin_token_is_refused() {
    let e = err("admin_token = \"change-me-to-a-long-random-token\"\n");
    assert_mentions(&e, &["admin_token", "the documentation's example"]);
    ok("admin_token = \"change-me-to-a-long-random-token-2\"\n");
}

#[test]
fn a_tolerance_under_a_second_is_refused() {
    for t in ["1ns", "100ms", "999ms"] {
        let e = err(&shop(&format!("tolerance = \"{t}\"")));
        assert_mentions(&e, &["sources.shop.tolerance", "at least 1s"]);
    }
    ok(&shop("tolerance = \"1s\""));
}

#[test]
fn route_names_are_printable_and_short_and_the_environment_can_reach_them() {
    let route = |name: &str| {
        shop(&format!(
            "[routes.{name}]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9000/h\"\n"
        ))
    };
    let long = format!("\"{}\"", "r".repeat(65));
    // `:` separates a NATS route's name from the key in its message id.
    for name in [
        "\"\"",
        "\"two words\"",
        "\"line\\nbreak\"",
        "\"a:x\"",
        long.as_str(),
    ] {
        let e = err(&route(name));
        assert_mentions(&e, &["routes.", "1 to 64 bytes"]);
    }
    let s = ok(&route("Orders"));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("routes.Orders") && w.contains("environment")),
        "{:?}",
        s.warnings
    );
    // A `.` separates tables in a variable's name as `__` does: no variable reaches it.
    let s = ok(&route("\"orders.eu\""));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("routes.orders.eu") && w.contains("environment")),
        "{:?}",
        s.warnings
    );
    let s = ok(&route("orders-v2_eu"));
    assert!(
        !s.warnings.iter().any(|w| w.contains("routes.")),
        "{:?}",
        s.warnings
    );
}

/// Absent, `./oncebox.toml` means zero-config; there but no file (a directory, a link to
/// nothing: a configuration mount gone missing), it must not quietly mean the same.
#[test]
fn a_default_config_path_that_is_no_file_is_refused_not_zero_config() {
    let e = jailed(|jail| {
        std::fs::create_dir(jail.directory().join("oncebox.toml")).expect("a directory");
        load(&Overrides::default()).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["oncebox.toml", "not a file"]);
    let e = jailed(|jail| {
        let link = jail.directory().join("oncebox.toml");
        std::os::unix::fs::symlink("/nonexistent/oncebox.toml", link).expect("a link");
        load(&Overrides::default()).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["oncebox.toml", "working directory"]);
    let zero = jailed(|_| load(&Overrides::default()).expect("zero-config"));
    assert!(zero.gateway.open_sources, "absent is zero-config");
}

/// oncebox substitutes no variables in its settings: an unfilled `${VAR}` taken as the admin
/// token, a source's HMAC key, a route's signing key or the database would be that text, known
/// to anyone who reads the file. Each is refused by field, without its value.
#[test]
fn an_unfilled_placeholder_is_refused_where_a_secret_or_the_database_belongs() {
    let placeholder = "unfilled variable placeholder";
    let e = err("admin_token = \"${ONCEBOX_ADMIN_TOKEN_VALUE}\"\n");
    assert_mentions(&e, &["admin_token", placeholder, "ONCEBOX_ADMIN_TOKEN"]);
    assert!(!e.contains("ADMIN_TOKEN_VALUE"), "{e}");
    let e = err("[sources.gh]\nsignature = \"github\"\nsecrets = [\"${GITHUB_SECRET}\"]\n");
    assert_mentions(&e, &["sources.gh.secrets[0]", placeholder, "secrets_env"]);
    assert!(!e.contains("GITHUB_SECRET"), "{e}");
    let e = err(&shop(
        "[routes.r]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9/\"\nsigning_secret = \"$SIGNING_KEY\"",
    ));
    assert_mentions(&e, &["routes.r.signing_secret", placeholder]);
    let e = err(&format!("database = \"${{DATABASE_URL}}\"\n{}", shop("")));
    assert_mentions(&e, &["database", placeholder, "ONCEBOX_DATABASE"]);
    // A `$` inside a real value is no placeholder.
    ok(&format!("admin_token = \"{}$x\"\n", "a".repeat(24)));
}

/// A value read from a variable is a sender's secret or the operator's token as it stands: it
/// may hold `${` anywhere or be `$` and a word. Refused as a placeholder, the advice was to
/// list the variable that already held it. Only a value that is nothing but `${NAME}` is.
#[test]
fn a_value_read_from_a_variable_is_refused_only_when_it_is_nothing_but_a_placeholder() {
    let toml = "[sources.billing]\nsignature = \"hmac-sha256\"\nheader = \"X-Sig\"\n\
                secrets_env = [\"BILLING_SECRET\"]\n";
    for secret in ["k9${Qa-7x", "$SharedKey123"] {
        let loaded = jailed(|jail| {
            jail.set_env("BILLING_SECRET", secret);
            jail.set_env("ONCEBOX_ADMIN_TOKEN", format!("{secret}{}", "t".repeat(16)));
            load_file(jail, toml)
        });
        assert!(loaded.is_ok(), "{secret}: {:?}", loaded.err());
    }
    let e = jailed(|jail| {
        jail.set_env("BILLING_SECRET", "${BILLING_KEY}");
        jail.set_env("ONCEBOX_ADMIN_TOKEN", "${ADMIN_TOKEN_VALUE}");
        load_file(jail, toml).map(|_| ()).unwrap_err()
    });
    let e = format!("{e:#}");
    let placeholder = "unfilled variable placeholder";
    assert_mentions(&e, &["sources.billing.secrets_env[0]", placeholder]);
    assert_mentions(&e, &["admin_token", placeholder]);
}

/// A secret read from a file keeps its last newline; no sender signs with it, so every event
/// would be refused 401 without a word why.
#[test]
fn a_secret_with_whitespace_around_it_is_refused() {
    for secret in ["sk_one\\n", " sk_one", "sk_one\\t"] {
        let e = err(&format!(
            "[sources.shop]\nsignature = \"stripe\"\nsecrets = [\"{secret}\"]\n"
        ));
        assert_mentions(
            &e,
            &["sources.shop.secrets[0]", "whitespace at its start or end"],
        );
        assert!(!e.contains("sk_one"), "{e}");
    }
    ok(&shop(""));
}

/// PostgreSQL's key=value form and a URL that lost its scheme would each name a SQLite file
/// (one per node, each deduplicating alone); refused, and never shown with the password.
#[test]
fn a_database_setting_meaning_a_server_but_naming_a_file_is_refused_without_its_password() {
    for (setting, why) in [
        (
            "host=db user=app password=hunter2 dbname=x",
            "key=value connection string",
        ),
        (
            "postgres//app:hunter2@db/x",
            "user:password@ but no scheme://",
        ),
        ("app:hunter2@db:5432/x", "user:password@ but no scheme://"),
        (
            "host = db password = hunter2",
            "key=value connection string",
        ),
    ] {
        let e = err(&format!("database = \"{setting}\"\n{}", shop("")));
        assert_mentions(&e, &["database", why, "postgres://"]);
        assert!(!e.contains("hunter2"), "{e}");
    }
    // Explicitly a file, any name goes; and so does a bare path.
    ok(&format!("database = \"sqlite://a b=c.db\"\n{}", shop("")));
    ok(&format!("database = \"data/me@example.db\"\n{}", shop("")));
}

/// HTTP strips spaces and tabs from the start of a header value, so an `hmac-sha256` prefix
/// starting with one never matches: every event was refused 401, with nothing pointing at the
/// setting.
#[test]
fn an_hmac_prefix_starting_with_a_space_or_tab_is_refused() {
    for prefix in [" sha256=", "\\tsha256="] {
        let e = err(&format!(
            "[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"x-sig\"\n\
             prefix = \"{prefix}\"\nsecrets = [\"k\"]\n"
        ));
        assert_mentions(&e, &["sources.acme.prefix", "starts with a space or tab"]);
    }
    let inner = ok(
        "[sources.acme]\nsignature = \"hmac-sha256\"\nheader = \"x-sig\"\n\
         prefix = \"sha256 \"\nsecrets = [\"k\"]\n",
    );
    let scheme = &super::policy(&inner, "acme").scheme;
    assert!(
        matches!(scheme, Scheme::HmacSha256 { prefix, .. } if prefix == "sha256 "),
        "a space inside is the sender's: {scheme:?}"
    );
}

/// A source signed as Stripe signs, without the preset, fingerprints the whole body, which
/// Stripe renders again for each attempt (`pending_webhooks`): its retry after a lost answer
/// would be refused 422. Said at start; the preset, or a fingerprint named, says nothing.
#[test]
fn the_stripe_scheme_without_its_preset_or_a_fingerprint_is_warned_of() {
    let warned = |s: &super::Settings| {
        s.warnings
            .iter()
            .any(|w| w.contains("source shop: signature \"stripe\" without preset"))
    };
    let bare = ok(&shop(""));
    assert!(warned(&bare), "{:?}", bare.warnings);
    for quiet in ["preset = \"stripe\"", "fingerprint = \"json\""] {
        let s = ok(&shop(quiet));
        assert!(!warned(&s), "{quiet}: {:?}", s.warnings);
    }
}
