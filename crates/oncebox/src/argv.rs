//! Credentials given on the command line, which every user of the machine can read (`ps`,
//! `/proc/PID/cmdline`): warned of, naming the flag and never the value.

use std::ffi::OsString;

/// The flags that take a URL, where else the same URL can be given unseen, and whether it is
/// a NATS URL (which may leave its scheme out, and takes a bare user name as a token).
/// `--url` (`send`, `bench`: the gateway's address) has no other place.
const URL_FLAGS: [(&str, Option<&str>, bool); 4] = [
    ("--database", Some("ONCEBOX_DATABASE"), false),
    ("--amqp", Some("ONCEBOX_AMQP_URL"), false),
    ("--nats", Some("ONCEBOX_NATS_URL"), true),
    ("--url", None, false),
];

/// The flag that is a secret whatever its value (`serve`'s and `bench`'s).
const TOKEN_FLAG: &str = "--admin-token";

/// A warning for each URL flag in `args` whose value carries a credential, and for the admin
/// token given as a flag.
pub fn exposed(args: impl IntoIterator<Item = OsString>) -> Vec<String> {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut warnings = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        if arg == TOKEN_FLAG || arg.starts_with(&format!("{TOKEN_FLAG}=")) {
            warnings.push(format!(
                "{TOKEN_FLAG}: a command line is visible to every user of this machine (ps, \
                 /proc); set ONCEBOX_ADMIN_TOKEN or admin_token in the configuration file \
                 instead"
            ));
        }
        for (flag, variable, nats) in URL_FLAGS {
            let value = if arg == flag {
                args.get(i + 1).map(String::as_str)
            } else {
                arg.strip_prefix(flag).and_then(|v| v.strip_prefix('='))
            };
            if value.is_some_and(|url| carries_credentials(url, nats)) {
                let instead = variable.map_or(String::new(), |v| format!("; set {v} instead"));
                warnings.push(format!(
                    "{flag}: its URL carries a credential, and a command line is visible to \
                     every user of this machine (ps, /proc){instead}"
                ));
            }
        }
    }
    warnings
}

/// Whether `url` holds a password, a token (a NATS URL's bare user name) or a
/// `password`/`token` query parameter.
fn carries_credentials(url: &str, nats: bool) -> bool {
    let full = match url.contains("://") {
        true => url.to_owned(),
        false if nats => format!("nats://{url}"),
        // A bare path (`--database me@x.db`): nothing of a URL.
        false => return false,
    };
    let Ok(parsed) = url::Url::parse(&full) else {
        // Not a URL the parser takes (a password with a `/` in it, not percent-encoded): a
        // user with something after a `:` before the last `@` is taken for a password, as
        // the redaction takes it.
        let rest = full.split_once("://").map_or(full.as_str(), |(_, r)| r);
        return rest
            .rfind('@')
            .is_some_and(|at| nats || rest[..at].contains(':'));
    };
    let token = nats && !parsed.username().is_empty();
    let in_query = parsed
        .query_pairs()
        .any(|(name, _)| matches!(name.as_ref(), "password" | "token" | "sslpassword"));
    parsed.password().is_some() || token || in_query
}

#[cfg(test)]
mod tests {
    use super::exposed;

    fn warned(args: &[&str]) -> Vec<String> {
        exposed(args.iter().map(Into::into))
    }

    #[test]
    fn a_url_flag_with_a_credential_is_warned_of_without_its_value() {
        let amqp = warned(&["oncebox", "consume", "--amqp", "amqp://guest:s3cret@h/%2f"]);
        assert_eq!(amqp.len(), 1);
        assert!(amqp[0].starts_with("--amqp:") && amqp[0].contains("ONCEBOX_AMQP_URL"));
        assert!(!amqp[0].contains("s3cret"));
        for args in [
            &["oncebox", "--database=postgres://u:pw@db/o", "events"][..],
            &["oncebox", "consume", "--nats", "tok3n@127.0.0.1:4222"],
            // Not a URL the parser takes: the password holds a `/`.
            &["oncebox", "--database", "postgres://u:p/ss@db/x", "events"],
            &[
                "oncebox",
                "relay",
                "--database",
                "postgres://u@db/o?password=pw",
            ],
        ] {
            assert_eq!(warned(args).len(), 1, "{args:?}");
        }
        for args in [
            &[
                "oncebox",
                "--database",
                "postgres://postgres@127.0.0.1/o",
                "events",
            ][..],
            &["oncebox", "--database", "sqlite://oncebox.db", "events"],
            &["oncebox", "consume", "--nats", "nats://127.0.0.1:4222"],
            &["oncebox", "consume", "--amqp"],
            &["oncebox", "--database", "me@x.db", "events"],
            &["oncebox", "send", "shop", "--url", "http://127.0.0.1:8080"],
        ] {
            assert!(warned(args).is_empty(), "{args:?}");
        }
    }

    /// The admin token on any command, and the gateway's URL of `send` and `bench` with a
    /// credential in it; `--url` has no variable to name instead.
    #[test]
    fn the_admin_token_and_a_gateway_url_with_a_credential_are_warned_of() {
        for args in [
            &["oncebox", "serve", "--admin-token", "s3cret-s3cret-s3cret"][..],
            &["oncebox", "bench", "--admin-token=s3cret-s3cret-s3cret"],
        ] {
            let w = warned(args);
            assert_eq!(w.len(), 1, "{args:?}");
            assert!(w[0].starts_with("--admin-token:") && !w[0].contains("s3cret"));
        }
        let w = warned(&["oncebox", "send", "shop", "--url", "http://u:t0ken@gw:8080"]);
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("--url:") && !w[0].contains("t0ken") && !w[0].contains("set "));
    }
}
