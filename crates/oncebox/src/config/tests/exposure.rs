//! Configurations that load but say less than they seem to, warned of: a tolerance on a scheme
//! that signs no timestamp, an unsigned source on a public listener whose events a route signs,
//! and an HTTP route that posts into this gateway's own ingress.

use super::ok;

const ROUTE_KEY: &str = "whsec_cm91dGUtc2lnbmluZy1rZXk=";

fn warned(s: &super::Settings, part: &str) -> bool {
    s.warnings.iter().any(|w| w.contains(part))
}

#[test]
fn a_tolerance_where_no_timestamp_is_signed_is_warned_of() {
    let bounds = "signs no timestamp, so the tolerance bounds nothing";
    for scheme in ["github", "none"] {
        let secrets = if scheme == "none" {
            ""
        } else {
            "secrets = [\"k\"]"
        };
        let s = ok(&format!(
            "[sources.a]\nsignature = \"{scheme}\"\n{secrets}\ntolerance = \"1m\"\n"
        ));
        assert!(
            warned(
                &s,
                &format!("sources.a.tolerance: signature {scheme} {bounds}")
            ),
            "{:?}",
            s.warnings
        );
    }
    // Stripe signs a timestamp; and without a tolerance set there is nothing to mislead.
    let s = ok("[sources.a]\nsignature = \"stripe\"\nsecrets = [\"k\"]\ntolerance = \"1m\"\n");
    assert!(!warned(&s, bounds), "{:?}", s.warnings);
    let s = ok("[sources.a]\nsignature = \"github\"\nsecrets = [\"k\"]\n");
    assert!(!warned(&s, bounds), "{:?}", s.warnings);
}

fn signed_route_of_unsigned_source(listen: &str) -> String {
    format!(
        "listen = \"{listen}\"\n[sources.open]\nsignature = \"none\"\n\
         [routes.r]\nsources = [\"open\"]\nurl = \"http://10.0.0.9/in\"\n\
         signing_secret = \"{ROUTE_KEY}\"\n"
    )
}

#[test]
fn a_route_signing_what_anyone_on_the_network_posted_is_warned_of() {
    let vouches = "routes.r: it signs the events of source open, which takes unsigned events";
    let s = ok(&signed_route_of_unsigned_source("0.0.0.0:8080"));
    assert!(warned(&s, vouches), "{:?}", s.warnings);
    // Only this machine's clients can post on a loopback listener.
    let s = ok(&signed_route_of_unsigned_source("127.0.0.1:8080"));
    assert!(!warned(&s, vouches), "{:?}", s.warnings);
}

fn route_to(url: &str) -> String {
    format!(
        "listen = \"127.0.0.1:8080\"\n[sources.shop]\nsignature = \"none\"\n\
         [sources.other]\nsignature = \"none\"\n\
         [routes.r]\nsources = [\"shop\"]\nurl = \"{url}\"\n"
    )
}

#[test]
fn an_http_route_into_its_own_sources_ingress_is_warned_of() {
    let loop_ = "routes.r: it posts to this gateway's own ingress for source shop";
    for url in [
        "http://127.0.0.1:8080/v1/sources/shop/events",
        "http://localhost:8080/v1/sources/shop/events",
        "http://[::1]:8080/v1/sources/shop/events",
    ] {
        let s = ok(&route_to(url));
        assert!(warned(&s, loop_), "{url}: {:?}", s.warnings);
    }
    for url in [
        // Another source of this gateway: a chain, not a loop of its own.
        "http://127.0.0.1:8080/v1/sources/other/events",
        "http://127.0.0.1:9090/v1/sources/shop/events",
        "http://10.0.0.9:8080/v1/sources/shop/events",
        "http://127.0.0.1:8080/hooks",
    ] {
        let s = ok(&route_to(url));
        assert!(!warned(&s, "own ingress"), "{url}: {:?}", s.warnings);
    }
}
