//! The relay's settings: a route's retry age must outlast its first backoff, the lease every timeout (by less than 10 s, warned of), `[relay] poll`
//! must let an idle relay rest, and its counts be at least 1; each refused by its field and where it came from.

use std::time::Duration;

use super::{assert_mentions, err, ok, shop};

/// `[sources.shop]` and `[routes.r]` to an HTTP receiver with `extra` lines.
fn route(extra: &str) -> String {
    shop(&format!(
        "[routes.r]\nsources = [\"shop\"]\nurl = \"http://127.0.0.1:9000/hooks\"\n{extra}\n"
    ))
}

/// A max_age of zero, or not longer than the first backoff, would leave a failure one more
/// try at most, at max_age: refused under the route's field, with the base it must outlast.
#[test]
fn a_routes_max_age_must_outlast_its_first_backoff() {
    for (lines, base) in [
        ("max_age = \"0s\"", "1s"),
        ("max_age = \"500ms\"", "1s"),
        ("max_age = \"1s\"", "1s"),
        (
            "max_age = \"10s\"\nbackoff = { base = \"1m\", cap = \"1h\" }",
            "1m",
        ),
    ] {
        let e = err(&route(lines));
        assert_mentions(&e, &["routes.r.max_age", "longer than backoff.base", base]);
    }
    let s = ok(&route("max_age = \"2s\""));
    assert_eq!(s.gateway.routes[0].retry.max_age, Duration::from_secs(2));
}

/// `poll = "0s"` would spin an idle relay; the smallest accepted is 1 ms, also from the
/// environment.
#[test]
fn a_relay_poll_of_zero_is_refused() {
    for poll in ["0s", "0ms", "500us"] {
        let e = err(&format!("{}\n[relay]\npoll = \"{poll}\"\n", shop("")));
        assert_mentions(&e, &["relay.poll", "at least 1ms"]);
    }
    let e = super::jailed(|jail| {
        jail.set_env("ONCEBOX_RELAY__POLL", "0s");
        super::load_file(jail, &shop("")).map(|_| ()).unwrap_err()
    });
    assert_mentions(&format!("{e:#}"), &["relay.poll", "ONCEBOX_RELAY__POLL"]);
    let s = ok(&format!("{}\n[relay]\npoll = \"1ms\"\n", shop("")));
    assert_eq!(s.relay.idle_poll, Duration::from_millis(1));
}

/// A lease must hold half a second beyond every route's timeout: a claim needs time to reach
/// its send and record its outcome, and with less each claim would be given back and taken
/// again without end.
#[test]
fn a_relay_lease_must_outlast_every_timeout_by_half_a_second() {
    for lease in ["10s", "10001ms", "10499ms"] {
        let e = err(&format!(
            "{}\n[relay]\nlease = \"{lease}\"\n",
            route("timeout = \"10s\"")
        ));
        assert_mentions(&e, &["relay.lease", "500ms longer than routes.r.timeout"]);
    }
    let s = ok(&format!(
        "{}\n[relay]\nlease = \"10500ms\"\n",
        route("timeout = \"10s\"")
    ));
    assert_eq!(s.relay.lease, Duration::from_millis(10_500));
    // Allowed, but half of 500ms is all the time an outcome answered late has to be recorded.
    let tight = "relay.lease: holds only 500ms beyond routes.r.timeout";
    assert!(
        s.warnings.iter().any(|w| w.starts_with(tight)),
        "{:?}",
        s.warnings
    );
    for (lease, warned) in [("19999ms", true), ("20s", false)] {
        let s = ok(&format!(
            "{}\n[relay]\nlease = \"{lease}\"\n",
            route("timeout = \"10s\"")
        ));
        let said = s.warnings.iter().any(|w| w.starts_with("relay.lease:"));
        assert_eq!(said, warned, "{lease}: {:?}", s.warnings);
    }
    // The defaults say nothing.
    let s = ok(&route(""));
    assert!(
        !s.warnings.iter().any(|w| w.starts_with("relay.lease:")),
        "{:?}",
        s.warnings
    );
}

/// `batch` and `circuit_threshold` are refused each by its own field, and said to come from
/// where they came from, though another field of `[relay]` came from a variable (figment tags
/// a table with the last provider that touched it: the file's `batch` was said to come from
/// `ONCEBOX_RELAY`, a variable that does not exist).
#[test]
fn relay_counts_of_zero_are_refused_by_their_field_and_their_origin() {
    for field in ["batch", "circuit_threshold"] {
        let e = super::jailed(|jail| {
            jail.set_env("ONCEBOX_RELAY__POLL", "5ms");
            super::load_file(jail, &format!("{}\n[relay]\n{field} = 0\n", shop("")))
                .map(|_| ())
                .unwrap_err()
        });
        let e = format!("{e:#}");
        assert_mentions(&e, &[&format!("relay.{field}: must be at least 1 (in ")]);
        assert!(!e.contains("ONCEBOX_RELAY)"), "{e}");
    }
}

/// A problem of a whole table names where the table came from only when all of it came from
/// one place.
#[test]
fn a_tables_problem_names_its_origin_only_when_it_is_one() {
    let both = "signing_secret = \"a-route-signing-key\"\nsigning_secret_env = \"ROUTE_KEY\"";
    let e = err(&route(both));
    assert_mentions(
        &e,
        &["routes.r: set signing_secret or signing_secret_env, not both (in "],
    );
    let e = super::jailed(|jail| {
        jail.set_env("ONCEBOX_ROUTES__R__SIGNING_SECRET_ENV", "ROUTE_KEY");
        super::load_file(jail, &route("signing_secret = \"a-route-signing-key\""))
            .map(|_| ())
            .unwrap_err()
    });
    let e = format!("{e:#}");
    assert_mentions(
        &e,
        &["routes.r: set signing_secret or signing_secret_env, not both"],
    );
    assert!(!e.contains("ONCEBOX_ROUTES__R)"), "{e}");
    assert!(!e.contains("not both (in "), "{e}");
}
