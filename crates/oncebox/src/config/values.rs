//! Setting values that cannot be what was meant: an unfilled `${VARIABLE}` placeholder taken
//! as a secret, a token or a database, and a secret with whitespace around it. No message shows
//! the value.

use super::Problems;

/// Whether `value` reads as a variable placeholder nobody filled: `${NAME}` anywhere, or
/// `$NAME` as the whole value. oncebox substitutes no variables in its settings, so such a text
/// would be used as it stands: an admin token or an HMAC key anyone reading the file (a
/// repository, a chart) knows, or a SQLite file called `${DATABASE_URL}`, each node keeping
/// its own.
fn placeholder(value: &str) -> bool {
    if value.contains("${") {
        return true;
    }
    value.strip_prefix('$').is_some_and(|name| {
        name.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// Pushes under `at` when `value` is a [`placeholder`]; `instead` says what to set.
fn refuse_placeholder(at: &str, value: &str, instead: &str, p: &mut Problems<'_>) {
    if placeholder(value) {
        p.push(
            at,
            format_args!(
                "looks like an unfilled variable placeholder (the value is not shown): oncebox \
                 substitutes no variables in its settings, and would use the text itself; \
                 {instead}"
            ),
        );
    }
}

/// Pushes under `database` and `admin_token` when either is a [`placeholder`].
pub(super) fn refuse_placeholders(database: &str, admin_token: Option<&str>, p: &mut Problems<'_>) {
    let instead = "set ONCEBOX_DATABASE or pass --database";
    refuse_placeholder("database", database, instead, p);
    if let Some(token) = admin_token {
        let instead = "set ONCEBOX_ADMIN_TOKEN or pass --admin-token";
        refuse_placeholder("admin_token", token, instead, p);
    }
}

/// Whether a secret at `at` can be used as written, pushing why not: no placeholder, and no
/// whitespace at either end. A secret read from a file keeps the file's last newline (a
/// Kubernetes secret made with `--from-file`, `$(cat key)` in some shells), and a key with it
/// matches no signature: every event would be refused `401` with nothing saying why.
pub(super) fn usable_secret(at: &str, value: &str, instead: &str, p: &mut Problems<'_>) -> bool {
    let before = p.count();
    refuse_placeholder(at, value, instead, p);
    if value.trim() != value {
        p.push(
            at,
            "has whitespace at its start or end (a file's last newline?), which no sender signs \
             with: remove it (the value is not shown)",
        );
    }
    p.count() == before
}

#[cfg(test)]
mod tests {
    use super::placeholder;

    #[test]
    fn placeholders_are_told_from_values() {
        for unfilled in [
            "${ADMIN_TOKEN}",
            "$ADMIN_TOKEN",
            "$_x1",
            "postgres://${PG}/x",
            "${",
        ] {
            assert!(placeholder(unfilled), "{unfilled}");
        }
        for value in [
            "whsec_abc$",
            "a$B",
            "$",
            "$1abc",
            "pa$$word",
            "$abc-def",
            "sqlite://x.db",
        ] {
            assert!(!placeholder(value), "{value}");
        }
    }
}
