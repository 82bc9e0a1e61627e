//! Settings that load but could never work are refused at start, by field: pointers to the
//! whole body, a sub-second tolerance, unprintable route names, the documentation's example
//! admin token, and a `./oncebox.toml` that is there but no file.

use super::{Overrides, assert_mentions, err, jailed, load, ok, shop};

#[test]
fn a_pointer_to_the_whole_body_is_refused_where_one_value_is_meant() {
    let whole = "the empty pointer names the whole body";
    let e = err(&shop("event_id = { pointer = \"\" }"));
    assert_mentions(&e, &["sources.shop.event_id.pointer", whole]);
    let e = err(&shop("order = { entity = \"\", version = \"/created\" }"));
    assert_mentions(&e, &["sources.shop.order.entity", whole]);
    let e = err(&shop("order = { entity = \"/id\", version = \"\" }"));
    assert_mentions(&e, &["sources.shop.order.version", whole]);
    let consumer = "[consumers.c]\nsource = \"s\"\nkey = { pointer = \"\" }\nqueue = \"q\"\n";
    assert_mentions(&err(consumer), &["consumers.c.key.pointer", whole]);
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
    for name in ["\"\"", "\"two words\"", "\"line\\nbreak\"", long.as_str()] {
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
