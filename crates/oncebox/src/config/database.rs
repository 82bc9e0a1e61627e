//! The `database` setting read as the store will read it, so that `check` refuses what every
//! other command would: a control character, a SQLite setting naming no lasting file, an
//! unknown scheme, or a PostgreSQL URL the driver cannot parse. Messages show the URL only
//! redacted.

use super::Problems;
use super::redact_url;

/// Pushes under `database` why the store could not open `database`, if it could not for what
/// the setting says (a server that is down is found when the store opens, not here).
pub(super) fn validate(database: &str, p: &mut Problems<'_>) {
    if database.trim().is_empty() {
        p.push("database", "must not be empty");
    } else if database.contains(char::is_control) {
        // A NUL ends the C string SQLite is given, and any other (a pasted newline or tab)
        // names a file or a server nobody meant. Let through, it passed `check` and every
        // command then failed as a store to retry later (exit 4), which it never becomes.
        p.push(
            "database",
            format_args!(
                "{:?} contains a control character: remove it",
                redact_url(database)
            ),
        );
    } else if let Some(Err(why)) = crate::store::sqlite_file(database) {
        // Refused here, not when the store opens: SQLite would open something for each, and
        // `check`, 202s and /readyz would all say yes while nothing lasts.
        p.push("database", format_args!("{:?} {why}", redact_url(database)));
    } else if !crate::store::is_supported(database) {
        // Refused here so `check` says so; shown redacted, since it may carry a password.
        p.push(
            "database",
            format_args!(
                "unsupported URL {}: use sqlite://PATH or postgres://USER@HOST/DB",
                redact_url(database)
            ),
        );
    } else if crate::store::is_postgres(database)
        && let Err(e) = oncebox_postgres::Options::new(database).check_url()
    {
        // The driver's reason names the part (`ssl_mode`, the port, the address), never the
        // user info; the URL is shown as the store's own messages show it.
        p.push(
            "database",
            format_args!(
                "{}: {}",
                crate::store::describe(database),
                said_once(&e.to_string())
            ),
        );
    }
}

/// `reason` without a part repeated right after itself: sqlx wraps a setting's error in its
/// configuration error once more (`error with configuration: error with configuration:
/// unknown value "bogus" for `ssl_mode``).
fn said_once(reason: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in reason.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(": ")
}
