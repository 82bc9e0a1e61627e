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
    value.strip_prefix('$').is_some_and(identifier)
}

/// Whether `value` is nothing but a `${NAME}` placeholder. Values that do not come from the
/// file (a variable, a flag) are held only to this: what a sender chose as its secret, read
/// from a variable, is random text that may hold `${` anywhere or be `$` and a word, and was
/// refused with advice to list the variable that already held it.
fn whole_placeholder(value: &str) -> bool {
    value
        .strip_prefix("${")
        .and_then(|v| v.strip_suffix('}'))
        .is_some_and(identifier)
}

/// A variable's name: a letter or `_`, then letters, digits and `_`.
fn identifier(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Pushes under `at` when `value` is a [`placeholder`] (`written` in the file) or a
/// [`whole_placeholder`] (from anywhere else); `instead` says what to set.
fn refuse_placeholder(at: &str, value: &str, instead: &str, written: bool, p: &mut Problems<'_>) {
    let unfilled = if written {
        placeholder(value)
    } else {
        whole_placeholder(value)
    };
    if unfilled {
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
    let written = p.in_file("database");
    refuse_placeholder("database", database, instead, written, p);
    if let Some(token) = admin_token {
        let instead = "set ONCEBOX_ADMIN_TOKEN or pass --admin-token";
        let written = p.in_file("admin_token");
        refuse_placeholder("admin_token", token, instead, written, p);
    }
}

/// Whether a secret at `at` can be used as written, pushing why not: no placeholder, and no
/// whitespace at either end. A secret read from a file keeps the file's last newline (a
/// Kubernetes secret made with `--from-file`, `$(cat key)` in some shells), and a key with it
/// matches no signature: every event would be refused `401` with nothing saying why.
///
/// `written`: the value stands in the file, where a placeholder anywhere in it is refused; one
/// read from a variable is refused only when it is nothing but one ([`whole_placeholder`]).
pub(super) fn usable_secret(
    at: &str,
    value: &str,
    instead: &str,
    written: bool,
    p: &mut Problems<'_>,
) -> bool {
    let before = p.count();
    refuse_placeholder(at, value, instead, written, p);
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
    use super::{placeholder, whole_placeholder};

    #[test]
    fn whole_placeholders_are_only_a_name() {
        for unfilled in ["${ADMIN_TOKEN}", "${_x1}"] {
            assert!(whole_placeholder(unfilled), "{unfilled}");
        }
        for value in [
            "k9${Qa-7",
            "${",
            "${}",
            "${A}b",
            "a${B}",
            "$1abc",
            "$SharedKey123",
        ] {
            assert!(!whole_placeholder(value), "{value}");
        }
    }

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
