//! File, environment and flags in their order of precedence; secrets from the environment, and
//! secrets kept out of every message, `Debug` and summary, and read only by the commands
//! that use them.

use std::net::SocketAddr;
use std::time::Duration;

use oncebox_core::Source;

use super::super::{Overrides, Secrets, describe, load};
use super::{
    ADMIN_TOKEN, SHOP_SECRET, SHOP_SECRET_2, assert_mentions, design_example, err, jailed,
    load_file, ok, policy, shop,
};

#[test]
fn environment_overrides_the_file_and_flags_override_both() {
    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_LISTEN", "127.0.0.1:9999");
        jail.set_env("ONCEBOX_DATABASE", "sqlite:///tmp/x.db");
        jail.set_env("ONCEBOX_ADMIN_TOKEN", "1234567890123456");
        jail.set_env("ONCEBOX_SOURCES__SHOP__TOLERANCE", "2m");
        jail.set_env("ONCEBOX_LIMITS__CONCURRENCY", "7");
        // Not configuration data, but the test harness's own: must not be refused.
        jail.set_env("ONCEBOX_REQUIRE_SERVICES", "1");
        jail.set_env("ONCEBOX_POSTGRES_URL", "postgres://postgres@127.0.0.1/t");
        load_file(
            jail,
            &format!("listen = \"127.0.0.1:1\"\n{}", shop("tolerance = \"1m\"")),
        )
    })
    .expect("valid");
    assert_eq!(s.listen, "127.0.0.1:9999".parse::<SocketAddr>().unwrap());
    assert_eq!(s.database, "sqlite:///tmp/x.db");
    // Kept verbatim, not coerced to a number.
    assert_eq!(s.gateway.admin_token.as_deref(), Some("1234567890123456"));
    assert_eq!(policy(&s, "shop").tolerance, Duration::from_secs(120));
    assert_eq!(s.gateway.limits.concurrency, 7);

    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_LISTEN", "127.0.0.1:9999");
        jail.set_env("ONCEBOX_DATABASE", "sqlite://env.db");
        jail.create_file("oncebox.toml", &shop(""))
            .expect("written");
        load(&Overrides {
            listen: Some("127.0.0.1:7000".parse().unwrap()),
            database: Some("sqlite://flag.db".into()),
            admin_token: Some(ADMIN_TOKEN.into()),
            ..Overrides::default()
        })
    })
    .expect("valid");
    assert_eq!(s.listen, "127.0.0.1:7000".parse::<SocketAddr>().unwrap());
    assert_eq!(s.database, "sqlite://flag.db");
    assert_eq!(s.gateway.admin_token.as_deref(), Some(ADMIN_TOKEN));
}

/// A one-of table set in the file and another of its fields in the environment: figment adds
/// the variable's field to the file's table, which then holds two. Refused, as before, but
/// saying where each came from and what to do.
#[test]
fn a_one_of_table_merged_across_layers_says_so() {
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_SOURCES__SHOP__EVENT_ID__POINTER", "/id");
        load_file(jail, &shop("event_id = { header = \"webhook-id\" }"))
            .map(|_| ())
            .unwrap_err()
    });
    assert_mentions(
        &format!("{e:#}"),
        &[
            "sources.shop.event_id: set exactly one of header, pointer or derive",
            "the layers were merged",
            "header (in oncebox.toml)",
            "pointer (from environment variable ONCEBOX_SOURCES__SHOP__EVENT_ID__POINTER)",
            "unset the one not meant",
        ],
    );
}

#[test]
fn environment_errors_name_the_field_and_the_variable() {
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_SOURCES__SHOP__TOLERANCE", "5 parsecs");
        load_file(jail, &shop("")).map(|_| ()).unwrap_err()
    });
    let e = format!("{e:#}");
    assert_mentions(
        &e,
        &["sources.shop.tolerance", "ONCEBOX_SOURCES__SHOP__TOLERANCE"],
    );
    // A value that parses but is refused by validation, and a key that does not exist.
    for (var, value, field) in [
        (
            "ONCEBOX_SOURCES__SHOP__TOLERANCE",
            "2d",
            "sources.shop.tolerance",
        ),
        (
            "ONCEBOX_SOURCES__SHOP__TOLERANS",
            "5m",
            "sources.shop.tolerans",
        ),
        ("ONCEBOX_LIMITS__CONCURRENCY", "0", "limits.concurrency"),
    ] {
        let e = jailed(|jail| {
            jail.set_env(var, value);
            load_file(jail, &shop("")).map(|_| ()).unwrap_err()
        });
        assert_mentions(&format!("{e:#}"), &[field, &format!("variable {var}")]);
    }
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_LISTEN", "nowhere");
        load(&Overrides::default()).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["listen", "ONCEBOX_LISTEN"]);
}

/// A variable of ours that sets nothing is refused by name, with the one it most likely
/// meant: skipped, `ONCEBOX_DATABASE_URL` ran the gateway on a local SQLite file.
#[test]
fn mistyped_variables_are_refused_with_the_name_they_meant() {
    for (var, meant) in [
        ("ONCEBOX_DATABASE_URL", "ONCEBOX_DATABASE?"),
        ("ONCEBOX_ADMINTOKEN", "ONCEBOX_ADMIN_TOKEN?"),
        (
            "ONCEBOX_SOURCE__SHOP__TOLERANCE",
            "ONCEBOX_SOURCES__SHOP__TOLERANCE?",
        ),
        (
            "ONCEBOX_SOURCES_SHOP_TOLERANCE",
            "ONCEBOX_SOURCES__SHOP__TOLERANCE?",
        ),
        ("ONCEBOX_TEST_WHATEVER", "unknown variable"),
    ] {
        let e = jailed(|jail| {
            jail.set_env(var, "2m");
            load_file(jail, &shop("")).map(|_| ()).unwrap_err()
        });
        assert_mentions(&format!("{e:#}"), &[var, "unknown variable", meant]);
    }
    // A secret variable the configuration names is the operator's, whatever its name.
    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_SHOP_SECRET", SHOP_SECRET);
        load_file(
            jail,
            "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = [\"ONCEBOX_SHOP_SECRET\"]\n",
        )
    });
    assert!(s.is_ok(), "{:?}", s.err());
}

#[test]
fn environment_reaches_routes_relay_and_consumers() {
    let file = shop(
        "[routes.r]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9/hooks\"\n\
         [consumers.q]\nsource = \"shop\"\nqueue = \"orders\"\nkey = \"message-id\"\n\
         quarantine = \"dead\"\n",
    );
    let s = jailed(|jail| {
        jail.set_env("ONCEBOX_ROUTES__R__TIMEOUT", "7s");
        jail.set_env("ONCEBOX_RELAY__BATCH", "3");
        jail.set_env("ONCEBOX_CONSUMERS__Q__QUEUE", "payments");
        // Not configuration data, though it starts like the `relay` table.
        jail.set_env("ONCEBOX_RELAY_CHILD", "1");
        load_file(jail, &file)
    })
    .expect("valid");
    let route = s.gateway.routes.iter().find(|r| r.name == "r").unwrap();
    assert_eq!(route.timeout, Duration::from_secs(7));
    assert_eq!(s.relay.batch, 3);
    let consumer = s.consumers.iter().find(|c| c.name == "q").unwrap();
    assert!(
        format!("{:?}", consumer.broker).contains("payments"),
        "{consumer:?}"
    );
    for (var, value, field) in [
        ("ONCEBOX_RELAY__LEASE", "bogus", "relay.lease"),
        ("ONCEBOX_ROUTES__R__TIMEOUT", "bogus", "routes.r.timeout"),
    ] {
        let e = jailed(|jail| {
            jail.set_env(var, value);
            load_file(jail, &file).map(|_| ()).unwrap_err()
        });
        assert_mentions(&format!("{e:#}"), &[field, var]);
    }
}

#[test]
fn config_file_is_chosen_by_flag_then_env_then_cwd() {
    let s = jailed(|jail| {
        jail.create_file("elsewhere.toml", &shop(""))
            .expect("written");
        jail.set_env("ONCEBOX_CONFIG", "elsewhere.toml");
        load(&Overrides::default())
    })
    .expect("valid");
    assert!(!s.gateway.open_sources);
    let s = jailed(|jail| {
        jail.create_file("flag.toml", "[sources.flagged]\nsignature = \"none\"\n")
            .expect("written");
        jail.create_file("oncebox.toml", &shop(""))
            .expect("written");
        load(&Overrides {
            config: Some("flag.toml".into()),
            ..Overrides::default()
        })
    })
    .expect("valid");
    assert!(
        s.gateway
            .sources
            .contains_key(&Source::new("flagged").unwrap())
    );
    // A named file that is missing must not fall back to zero-config.
    let e = jailed(|_| {
        load(&Overrides {
            config: Some("missing.toml".into()),
            ..Overrides::default()
        })
        .map(|_| ())
        .unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["missing.toml", "--config"]);
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_CONFIG", "gone.toml");
        load(&Overrides::default()).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["gone.toml", "ONCEBOX_CONFIG"]);
    // Set but empty (a template's variable left unfilled) is no file named either.
    let e = jailed(|jail| {
        jail.set_env("ONCEBOX_CONFIG", "");
        load(&Overrides::default()).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["ONCEBOX_CONFIG", "empty"]);
}

#[test]
fn secrets_env_reads_variables_and_never_prints_values() {
    let s = jailed(|jail| {
        jail.set_env("SHOP_SECRET", SHOP_SECRET);
        jail.set_env("SHOP_SECRET_NEXT", SHOP_SECRET_2);
        load_file(
            jail,
            "[sources.shop]\npreset = \"standard-webhooks\"\n\
             secrets_env = [\"SHOP_SECRET\", \"SHOP_SECRET_NEXT\"]\n",
        )
    })
    .expect("valid");
    assert_eq!(policy(&s, "shop").secrets.len(), 2);
    let debug = format!("{s:?}");
    let summary = describe(&s);
    assert_mentions(
        &summary,
        &["2 secrets", "standard-webhooks", "header webhook-id"],
    );
    for text in [&debug, &summary] {
        assert!(!text.contains("c2hvcC1zaWduaW5n"), "{text}");
        assert!(!text.contains("YW5vdGhlci1zaG9w"), "{text}");
    }

    let e = jailed(|jail| {
        jail.set_env("SHOP_SECRET", SHOP_SECRET);
        load_file(
            jail,
            "[sources.shop]\npreset = \"standard-webhooks\"\n\
             secrets_env = [\"SHOP_SECRET\", \"SHOP_SECRET_MISSING\"]\n",
        )
        .map(|_| ())
        .unwrap_err()
    });
    let e = format!("{e:#}");
    assert_mentions(&e, &["sources.shop.secrets_env[1]", "not set"]);
    // A name that is not set may be a secret typed in its place: the path names the entry.
    assert!(!e.contains("SHOP_SECRET_MISSING"), "{e}");
    assert!(!e.contains("c2hvcC1zaWduaW5n"), "{e}");

    // A value the scheme refuses is reported by variable name only.
    let e = jailed(|jail| {
        jail.set_env("SHOP_SECRET", "whsec_not base64!");
        load_file(
            jail,
            "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = [\"SHOP_SECRET\"]\n",
        )
        .map(|_| ())
        .unwrap_err()
    });
    let e = format!("{e:#}");
    assert_mentions(&e, &["sources.shop.secrets_env[0] (SHOP_SECRET)", "base64"]);
    assert!(!e.contains("not base64!"), "{e}");
}

#[test]
fn secrets_stay_out_of_errors_debug_and_summary() {
    let e = err("[sources.shop]\nsignature = \"stripe\"\nsecrets = \"sk_live_leak\"\n");
    assert_mentions(&e, &["sources.shop.secrets", "not shown"]);
    assert!(!e.contains("sk_live_leak"), "{e}");
    // A TOML syntax error quotes the line; the quote is dropped.
    let e = err("[sources.shop]\nsecrets = [\"sk_live_leak\" \"x\"]\n");
    assert!(!e.contains("sk_live_leak"), "{e}");
    assert_mentions(&e, &["line 2"]);

    let s = ok(&design_example());
    let debug = format!("{s:?}");
    assert!(!debug.contains(ADMIN_TOKEN), "{debug}");
    assert!(!debug.contains("c2hvcC1zaWduaW5n"), "{debug}");
    let summary = describe(&s);
    assert!(!summary.contains(ADMIN_TOKEN), "{summary}");
    assert_mentions(
        &summary,
        &["shop", "1 secret", "webhook-id", "7days", "/data/object/id"],
    );
    let o = Overrides {
        admin_token: Some(ADMIN_TOKEN.into()),
        ..Overrides::default()
    };
    assert!(!format!("{o:?}").contains(ADMIN_TOKEN));
}

/// A secret typed where its variable's name belongs is not echoed by the message about it, with
/// or without the `=` padding that makes it no variable name at all.
#[test]
fn secrets_typed_into_env_fields_are_not_echoed() {
    for value in [
        "whsec_c2VjcmV0",
        "whsec_c2VjcmV0==",
        "whsec_c2Vj\\u0000cmV0",
    ] {
        let e = err(&format!(
            "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = [\"x\", \"{value}\"]\n"
        ));
        assert_mentions(&e, &["sources.shop.secrets_env[1]"]);
        assert!(!e.contains("c2VjcmV0") && !e.contains("cmV0"), "{e}");
        let e = err(&shop(&format!(
            "[routes.r]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9/hooks\"\n\
             signing_secret_env = \"{value}\"\n"
        )));
        assert_mentions(&e, &["routes.r.signing_secret_env"]);
        assert!(!e.contains("c2VjcmV0") && !e.contains("cmV0"), "{e}");
        // Given as one string where a list of names belongs: the type error leaves it out.
        let e = err(&format!(
            "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = \"{value}\"\n"
        ));
        assert_mentions(&e, &["sources.shop.secrets_env"]);
        assert!(!e.contains("c2VjcmV0") && !e.contains("cmV0"), "{e}");
    }
}

#[test]
fn a_command_reads_only_the_secrets_it_uses() {
    let toml = "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = [\"SHOP_SECRET\"]\n\
                [routes.r]\nsources = [\"shop\"]\nurl = \"https://example.com/hooks\"\n\
                signing_secret_env = \"ROUTE_SECRET\"\n";
    let load_with = |secrets: Secrets| {
        jailed(|jail| {
            jail.create_file("oncebox.toml", toml).expect("written");
            load(&Overrides {
                secrets,
                ..Overrides::default()
            })
        })
    };
    let (source, route) = ("sources.shop.secrets_env[0]", "routes.r.signing_secret_env");
    // Neither variable is set: a command refuses to start only over the ones it would use.
    for (secrets, named, not_named) in [
        (Secrets::All, vec![source, route], vec![]),
        (Secrets::Inbound, vec![source], vec![route]),
        (Secrets::Outbound, vec![route], vec![source]),
    ] {
        let e = format!("{:#}", load_with(secrets).map(|_| ()).unwrap_err());
        assert_mentions(&e, &named);
        for field in not_named {
            assert!(!e.contains(field), "{secrets:?}: {e}");
        }
    }
    let s = load_with(Secrets::Neither).expect("no secret is read");
    assert!(policy(&s, "shop").secrets.is_empty());
    assert!(s.gateway.routes[0].signing_secret.is_none());
}
