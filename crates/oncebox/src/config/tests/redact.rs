//! URLs are shown only redacted: in `check`'s summary, in `Debug` of the settings, and in the
//! message refusing a database URL of an unsupported scheme.

use super::super::{redact_route_url, redact_url};
use super::{assert_mentions, err, ok, shop};

#[test]
fn database_passwords_are_redacted_for_display() {
    assert_eq!(
        redact_url("postgres://app:hunter2@db:5432/oncebox?sslmode=require"),
        "postgres://***@db:5432/oncebox?sslmode=require"
    );
    assert_eq!(redact_url("sqlite://oncebox.db"), "sqlite://oncebox.db");
    assert_eq!(redact_url("oncebox.db"), "oncebox.db");
    // Without `scheme://`: a server's address written wrong still hides its password.
    assert_eq!(redact_url("postgres:/app:hunter2@db/x"), "***@db/x");
    assert_eq!(
        redact_url("host=db user=app password=hunter2 dbname=x"),
        "host=db user=app password=*** dbname=x"
    );
    assert_eq!(
        redact_url("host = db password = hunter2"),
        "host=db password=***"
    );
    // Drivers take a password in the query too; webhook receivers take tokens there.
    assert_eq!(
        redact_url("postgres://db/x?user=app&password=hunter2&sslmode=require#f"),
        "postgres://db/x?user=app&password=***&sslmode=require#f"
    );
    assert_eq!(
        redact_url("https://hooks.example/in?Access_Token=hunter2&sslPassword=hunter2&n=1"),
        "https://hooks.example/in?Access_Token=***&sslPassword=***&n=1"
    );
    assert_eq!(
        redact_url("postgres://app:hunter2@db?api_key=hunter2"),
        "postgres://***@db?api_key=***"
    );
}

/// A route's receiver takes its key anywhere after the host: in the path (a Slack, Discord or
/// Teams webhook) as under any query name (`?code=` for an Azure Function, `?sig=` for a SAS
/// URL). A route's URL is shown as far as its host, as the core's `Route` shows it; the user
/// info as `***@`, as for any URL.
#[test]
fn a_route_url_is_shown_only_as_far_as_its_host() {
    for (url, shown) in [
        (
            "https://hooks.slack.com/services/T0/B0/SLACKSECRET",
            "https://hooks.slack.com/***",
        ),
        (
            "https://fn.example/api/in?code=AZUREFUNCTIONKEY&sig=SASSIG",
            "https://fn.example/***",
        ),
        (
            "https://app:pa55@hooks.example:8443/s/{key}?v=1#frag",
            "https://***@hooks.example:8443/***",
        ),
        ("https://hooks.example?T0KEN", "https://hooks.example/***"),
        ("https://hooks.example#T0KEN", "https://hooks.example/***"),
        ("http://[::1]:9000/T0KEN", "http://[::1]:9000/***"),
        // An `@` in the path is no user info: the host before it is kept, the path hidden.
        (
            "https://social.example/@alice/T0KEN",
            "https://social.example/***",
        ),
        // A password pasted unencoded, `/` and all, is hidden whole.
        (
            "https://app:pa/55@hooks.example/in",
            "https://***@hooks.example/***",
        ),
        (
            "amqp://guest:pa55@rabbit:5672/%2f?exchange=orders&routing_key=paid",
            "amqp://***@rabbit:5672/***",
        ),
        ("nats://nats:4222?subject=orders", "nats://nats:4222/***"),
        ("https://hooks.example", "https://hooks.example"),
        ("no scheme/T0KEN", "***"),
    ] {
        assert_eq!(redact_route_url(url), shown, "{url}");
    }
}

/// The whole user info is hidden, a token without a colon too, and so is a password pasted
/// without percent-encoding whose `/`, `?` or `#` would end the authority by RFC 3986.
#[test]
fn user_info_is_hidden_whole_even_when_pasted_unencoded() {
    for (url, shown) in [
        (
            "https://s3cr3t@hooks.example/in",
            "https://***@hooks.example/in",
        ),
        (
            "nats://s3cr3t@nats:4222?subject=x",
            "nats://***@nats:4222?subject=x",
        ),
        ("postgres://app:ab/s3cr3t@db/x", "postgres://***@db/x"),
        ("postgres://app:ab?s3cr3t@db/x", "postgres://***@db/x"),
        ("postgres://app:ab#s3cr3t@db/x", "postgres://***@db/x"),
        ("postgres://app:s3/cr@3t@db/x", "postgres://***@db/x"),
        ("postgres://app:s3@cr/3t@db/x", "postgres://***@db/x"),
        ("postgres://app@db/x", "postgres://***@db/x"),
        (
            "postgres://app:s3cr3t@[::1]:5432/x",
            "postgres://***@[::1]:5432/x",
        ),
        // An address in the query is not taken for the host.
        (
            "https://app:s3cr3t@hooks.example/in?to=ops@example.com",
            "https://***@hooks.example/in?to=ops@example.com",
        ),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
    // Without user info, an `@` in the path or query is left alone: the URL stays readable.
    for url in [
        "https://hooks.example/in",
        "https://social.example/@alice/inbox",
        "https://hooks.example/in?to=ops@example.com",
        "http://127.0.0.1:9000/hooks",
        "http://[::1]:9000/@x",
        "postgres://db:5432/oncebox?sslmode=require",
    ] {
        assert_eq!(redact_url(url), url);
    }
}

/// Every URL of the settings is redacted in their `Debug`: the database's, and the routes'
/// receiver and status URLs, which the route's derived `Debug` would print raw.
#[test]
fn settings_debug_shows_no_url_unredacted() {
    let s = ok(&format!(
        "database = \"postgres://app:hunter2@db/oncebox\"\n{}",
        shop(
            "[routes.r]\nsources = [\"shop\"]\n\
             url = \"https://tok3n@hooks.example/in/P4THTOKEN?token=t0ken&code=c0de\"\n\
             status_url = \"https://app:pa55@status.example/s/S3CRET/{key}?sig=s1g\"\n"
        )
    ));
    let debug = format!("{s:?}");
    for secret in [
        "hunter2",
        "tok3n",
        "t0ken",
        "pa55",
        "c0de",
        "s1g",
        "P4THTOKEN",
        "S3CRET",
    ] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    assert_mentions(
        &debug,
        &[
            "https://***@hooks.example/***",
            "https://***@status.example/***",
            "db/oncebox",
        ],
    );
}

/// A database URL no store takes is refused by `check` under its field, without its password:
/// `serve`, `stats` and `migrate` would otherwise print it whole when they fail to open it.
#[test]
fn unsupported_database_url_is_refused_by_field_without_its_password() {
    let e = err(&format!(
        "database = \"postgress://app:hunter2@db/oncebox\"\n{}",
        shop("")
    ));
    assert_mentions(
        &e,
        &["database:", "postgress://***@db/oncebox", "sqlite://PATH"],
    );
    assert!(!e.contains("hunter2"), "{e}");
    for url in [
        "sqlite://o.db",
        "o.db",
        "postgresql://db/x",
        "postgres://db/x",
    ] {
        ok(&format!("database = \"{url}\"\n{}", shop("")));
    }
}
