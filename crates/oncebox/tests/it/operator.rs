//! What an operator gets told: a mistyped variable, a lasting problem as exit 2 with one
//! message, a dry run that ends as the run would, flags outside what a command does.

use crate::support::oncebox_with_env as with_env;
use crate::support::{oncebox, serve_with, text};

/// A container with `ONCEBOX_DATABASE_URL` ran on a local SQLite file: every command refuses
/// to start, naming the variable and the one it meant; the harness's variables pass.
#[test]
fn a_mistyped_variable_stops_every_command_with_the_name_it_meant() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let harness = [
        ("ONCEBOX_REQUIRE_SERVICES", "0"),
        ("ONCEBOX_POSTGRES_URL", "postgres://postgres@127.0.0.1/x"),
        ("ONCEBOX_SEED", "1"),
    ];
    assert_eq!(with_env(d, &harness, &["check"]).status.code(), Some(0));
    for (var, meant) in [
        ("ONCEBOX_DATABASE_URL", "ONCEBOX_DATABASE?"),
        ("ONCEBOX_ADMINTOKEN", "ONCEBOX_ADMIN_TOKEN?"),
        (
            "ONCEBOX_SOURCES_SHOP_TOLERANCE",
            "ONCEBOX_SOURCES__SHOP__TOLERANCE?",
        ),
    ] {
        for command in [
            &["check"][..],
            &["serve", "--listen", "127.0.0.1:0"],
            &["relay"],
            &["consume"],
            &["migrate"],
        ] {
            let out = with_env(d, &[(var, "postgres://db/o")], command);
            let said = text(&out);
            assert_eq!(out.status.code(), Some(2), "{var} {command:?}: {said}");
            assert!(
                said.contains(var) && said.contains(meant),
                "{command:?}: {said}"
            );
        }
    }
    // Nothing was created by a command that refused.
    assert!(!d.join("oncebox.db").exists());
}

/// A directory where the database file belongs, or a file in a directory that does not
/// exist, stays so: exit 2 (not 4, "retry later"), said once.
#[test]
fn a_database_path_no_retry_can_open_is_exit_2_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("data")).unwrap();
    for (db, cause) in [
        ("sqlite://data", "is a directory"),
        ("sqlite://missing/o.db", "missing, which is not a directory"),
    ] {
        for command in ["migrate", "stats"] {
            let out = oncebox(d, &["--database", db, command]);
            let said = text(&out);
            // `stats`, which creates nothing, says what `migrate` says, not "no database at"
            // with advice to run `migrate`.
            assert_eq!(out.status.code(), Some(2), "{db} {command}: {said}");
            assert_eq!(said.matches(cause).count(), 1, "{db} {command}: {said}");
            assert_eq!(said.lines().count(), 1, "{said}");
        }
    }
}

/// A dry run counts the deliveries the run would make due, and ends as the run would: events
/// that match no route have none, so both say so and exit 5.
#[test]
fn a_dry_run_counts_what_the_run_would_make_due_and_ends_as_it_would() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "listen = \"127.0.0.1:0\"\n[sources.shop]\nsignature = \"none\"\n",
    )
    .unwrap();
    let server = serve_with(d, &[]);
    for id in ["evt_1", "evt_2"] {
        let out = oncebox(d, &["send", "shop", "--id", id, "--url", &server.1]);
        assert!(out.status.success(), "{}", text(&out));
    }
    server.stop();
    let dry = oncebox(d, &["redeliver", "--source", "shop", "--dry-run"]);
    let real = oncebox(d, &["redeliver", "--source", "shop", "--all"]);
    for out in [&dry, &real] {
        assert_eq!(out.status.code(), Some(5), "{}", text(out));
        assert!(
            text(out).contains("0 deliveries of 2 events"),
            "{}",
            text(out)
        );
        assert!(text(out).contains("nothing to redeliver"), "{}", text(out));
    }
}

/// `purge`'s help says a retention is needed where no sources are configured, as the command
/// does; a short `--retention` is warned of as the same retention in the file is, and one
/// under the presets' 3 days wherever it reaches sources no configuration says the preset of
/// (all of them for a cron job away from the gateway's file, those the file does not name
/// otherwise): warned, not refused, so scripts still exit 0.
#[test]
fn purge_help_matches_what_it_does_and_a_short_retention_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let created = oncebox(d, &["migrate"]);
    assert!(created.status.success());
    assert!(
        text(&created).contains("created, schema up to date"),
        "{}",
        text(&created)
    );
    let again = text(&oncebox(d, &["migrate"]));
    assert!(
        again.contains("schema up to date") && !again.contains("created"),
        "{again}"
    );
    let help = text(&oncebox(d, &["purge", "--help"]));
    let refused = oncebox(d, &["purge"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        help.contains("required where no [sources] are configured"),
        "{help}"
    );
    assert!(!help.contains("  oncebox purge        "), "{help}");
    let short = oncebox(d, &["purge", "--retention", "1s", "--output", "json"]);
    assert!(short.status.success(), "{}", text(&short));
    assert!(
        String::from_utf8_lossy(&short.stderr).contains("--retention 1s is shorter than a day"),
        "{}",
        text(&short)
    );
    let long = oncebox(d, &["purge", "--retention", "30d"]);
    assert!(!text(&long).contains("warning"), "{}", text(&long));

    assert!(help.contains("warned of under the 3 days"), "{help}");
    let unread = "no configuration naming [sources] was read";
    let days = oncebox(d, &["purge", "--retention", "2d"]);
    let warned = String::from_utf8_lossy(&days.stderr);
    assert_eq!(days.status.code(), Some(0), "{}", text(&days));
    assert!(
        warned.contains("--retention 2days is shorter than the 3days")
            && warned.contains("stripe, github and standard-webhooks")
            && warned.contains(unread),
        "{warned}"
    );
    let horizon = oncebox(d, &["purge", "--retention", "3d"]);
    assert!(!text(&horizon).contains("warning"), "{}", text(&horizon));
    // With the sources configured, each keeps its own retention, checked against its preset
    // when the file was read: `--retention` reaches only sources the file does not name, such
    // as another gateway's in a shared database, which may be Stripe's: warned of all the same.
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.shop]\nsignature = \"none\"\n",
    )
    .unwrap();
    let configured = oncebox(d, &["purge", "--retention", "2d"]);
    let warned = String::from_utf8_lossy(&configured.stderr);
    assert_eq!(configured.status.code(), Some(0), "{}", text(&configured));
    assert!(!warned.contains(unread), "{warned}");
    assert!(
        warned.contains("--retention 2days is shorter than the 3days")
            && warned.contains("stripe, github and standard-webhooks")
            && warned.contains(
                "every source the configuration does not name in [sources] (it names shop)"
            ),
        "{warned}"
    );
    let horizon = oncebox(d, &["purge", "--retention", "3d"]);
    assert!(!text(&horizon).contains("warning"), "{}", text(&horizon));
}

/// A value outside an enumeration is named with the values expected, each quoted once.
#[test]
fn an_unknown_preset_is_named_with_the_presets_expected() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), "[sources.a]\npreset = \"strip\"\n").unwrap();
    let out = oncebox(d, &["check"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(
            "sources.a.preset: unknown value \"strip\" (expected one of `stripe`, `github`, \
             `standard-webhooks`)"
        ),
        "{said}"
    );
    assert!(!said.contains("``"), "{said}");
}

/// A `.` in a source's or route's name reads as `__` in a variable's name, and so does a `_`
/// next to the `__` after it, so the environment cannot reach its settings: `check` warns of
/// it as of an upper-case route or consumer name.
#[test]
fn dotted_source_and_route_names_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.\"shop.eu\"]\nsignature = \"none\"\n\
         [sources.shop_us]\nsignature = \"none\"\n\
         [routes.\"orders.v2\"]\nsources = [\"shop.eu\"]\nurl = \"http://127.0.0.1:9/hook\"\n\
         [routes.orders_v3]\nsources = [\"shop_us\"]\nurl = \"http://127.0.0.1:9/hook\"\n\
         [routes.orders_]\nsources = [\"shop_us\"]\nurl = \"http://127.0.0.1:9/hook\"\n\
         [consumers.Orders]\nsource = \"shop_us\"\nqueue = \"q\"\nkey = \"message-id\"\n\
         quarantine = \"oncebox.quarantine\"\n",
    )
    .unwrap();
    let check = oncebox(d, &["check"]);
    let said = text(&check);
    assert_eq!(check.status.code(), Some(0), "{said}");
    let cannot = "the environment cannot override";
    assert_eq!(said.matches(cannot).count(), 4, "{said}");
    // `ORDERS___TIMEOUT` splits as `orders` and `_timeout`; an upper-case consumer name is
    // lower-cased away.
    for table in ["routes.orders_", "consumers.Orders"] {
        assert!(
            said.contains(&format!("warning: {table}: the environment")),
            "{said}"
        );
    }
    assert!(
        said.contains("warning: sources.\"shop.eu\": the environment"),
        "{said}"
    );
    assert!(
        said.contains("warning: routes.orders.v2: the environment"),
        "{said}"
    );
    // As warned: the variable names a table the route does not have.
    for name in [
        "ONCEBOX_ROUTES__ORDERS.V2__TIMEOUT",
        "ONCEBOX_ROUTES__ORDERS___TIMEOUT",
    ] {
        let out = with_env(d, &[(name, "30s")], &["check"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
    }
    // The names without a dot are reached.
    let env = [("ONCEBOX_ROUTES__ORDERS_V3__TIMEOUT", "30s")];
    let out = with_env(d, &env, &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A configuration variable whose value is not UTF-8 is refused by name: read lossily, a
/// stray byte in a secret became U+FFFD, and every event was then `401` with nothing pointing
/// at the variable.
#[test]
fn a_configuration_variable_not_utf8_is_refused_by_name() {
    use std::os::unix::ffi::OsStringExt as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.shop]\nsignature = \"none\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("check")
        .current_dir(d)
        .env_remove("ONCEBOX_CONFIG")
        .env(
            "ONCEBOX_SOURCES__SHOP__PREFIX",
            std::ffi::OsString::from_vec(b"sha\xff=".to_vec()),
        )
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("ONCEBOX_SOURCES__SHOP__PREFIX is not valid UTF-8"),
        "{said}"
    );
    // The prefix in any case, as it is read.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("check")
        .current_dir(d)
        .env_remove("ONCEBOX_CONFIG")
        .env(
            "oncebox_sources__shop__prefix",
            std::ffi::OsString::from_vec(b"sha\xff=".to_vec()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Flags outside what a command does are refused by name before anything runs.
#[test]
fn out_of_range_flags_are_refused_locally() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(oncebox(d, &["migrate"]).status.success());
    for limit in ["0", "501", "1000"] {
        for listing in [&["events"][..], &["deliveries", "list"]] {
            let out = oncebox(d, &[listing, &["--limit", limit]].concat());
            assert_eq!(out.status.code(), Some(2), "{limit}: {}", text(&out));
            assert!(text(&out).contains("from 1 to 500"), "{}", text(&out));
        }
    }
    assert!(oncebox(d, &["events", "--limit", "500"]).status.success());
    // A bad value names its flag; a missing choice names both of its flags.
    let out = oncebox(d, &["events", "--source", "BAD"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--source"), "{}", text(&out));
    let out = oncebox(d, &["deliveries", "resolve", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--delivered") && text(&out).contains("--dead"),
        "{}",
        text(&out)
    );
    let out = oncebox(d, &["deliveries", "resolve", "1", "--delivered", "--dead"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // Checked before anything is sent: nothing listens at this URL.
    let url = ["--url", "http://127.0.0.1:9"];
    let out = oncebox(d, &[&["send", "demo", "--id", "x "][..], &url].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("must not end with a space"),
        "{}",
        text(&out)
    );

    // A source that reads its id from the body: an --id the body contradicts is refused.
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.shop]\nsignature = \"none\"\nevent_id = { pointer = \"/id\" }\n\
         [storage]\nplacement = 99999\n",
    )
    .unwrap();
    let out = oncebox(
        d,
        &[
            &[
                "send",
                "shop",
                "--id",
                "evt_9",
                "--body",
                r#"{"id":"evt_X"}"#,
            ][..],
            &url,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("\"evt_X\""), "{}", text(&out));

    // A CPU this process may not run on is warned of.
    let check = oncebox(d, &["check"]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(
        text(&check).contains("warning: storage.placement = 99999"),
        "{}",
        text(&check)
    );
}

/// `check` takes `serve`'s own flags and judges them as `serve` will: a zero-config gateway
/// listening beyond loopback, or a short admin token, passed `check` and was refused only when
/// `serve` started with them.
#[test]
fn check_judges_serves_flags_as_serve_will() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_eq!(
        oncebox(d, &["check", "--listen", "127.0.0.1:8080"])
            .status
            .code(),
        Some(0)
    );
    let wide = oncebox(d, &["check", "--listen", "0.0.0.0:8080"]);
    assert_eq!(wide.status.code(), Some(2), "{}", text(&wide));
    assert!(text(&wide).contains("listen"), "{}", text(&wide));
    let short = oncebox(d, &["check", "--admin-token", "short"]);
    assert_eq!(short.status.code(), Some(2), "{}", text(&short));
    assert!(text(&short).contains("admin_token"), "{}", text(&short));
}
