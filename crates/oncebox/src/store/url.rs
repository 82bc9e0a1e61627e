//! What a database setting names: a SQLite file, a PostgreSQL server, or nothing oncebox can
//! keep events in, refused with what to write instead.

use std::fmt;

/// What to write instead of a SQLite setting that names no lasting file.
const SQLITE_FORMS: &str =
    "write sqlite://oncebox.db (in the working directory) or sqlite:///abs/path.db";

/// Why a SQLite database setting names no file that outlives the process, or not the file
/// that was meant. Each would pass a start-up check and answer 202 while keeping nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAFile {
    /// `sqlite://` with nothing after it, as `sqlite://${DB_PATH}` gives with the variable
    /// unset: SQLite opens a private temporary database, deleted when it is closed.
    Empty,
    /// `:memory:`: a database per connection, so readers see another, empty one; gone at exit.
    Memory,
    /// A `file:` URI: its parameters (`mode=memory`, `vfs=…`) may keep nothing on disk.
    Uri,
    /// A `?` after the path (`?mode=rwc`): not read as parameters, it becomes part of the
    /// file's name.
    Query,
    /// `sqlite:PATH` (sqlx's spelling): without `//` it is a file literally named
    /// `sqlite:PATH`.
    NoSlashes,
    /// `host=db user=app password=…`: PostgreSQL's key=value form, which would name a SQLite
    /// file of that text, one per node, each deduplicating alone.
    Keywords,
    /// `user:password@host/…` with its scheme or `://` lost (`postgres//app:pw@db/x`): a server
    /// meant, a file named.
    Credentials,
}

impl fmt::Display for NotAFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            NotAFile::Empty => {
                "names no file (is a variable in it unset?): SQLite would keep the events in a \
                 temporary database deleted at exit"
            }
            NotAFile::Memory => {
                "is an in-memory database: nothing would survive a restart, and every reader \
                 would see another, empty database"
            }
            NotAFile::Uri => {
                "is a SQLite file: URI, which oncebox does not take (mode=memory or a vfs would \
                 keep nothing on disk)"
            }
            NotAFile::Query => {
                "has a query (?…), which oncebox does not read: it would become part of the \
                 file's name"
            }
            NotAFile::NoSlashes => {
                "lacks the // after sqlite: and would name a file literally called so"
            }
            NotAFile::Keywords => {
                return f.write_str(
                    "is a key=value connection string, which oncebox does not read (it would \
                     name a SQLite file): write it as a URL, \
                     postgres://USER:PASSWORD@HOST:5432/DB",
                );
            }
            NotAFile::Credentials => {
                return f.write_str(
                    "holds user:password@ but no scheme://, so it would name a SQLite file: \
                     write postgres://USER:PASSWORD@HOST:5432/DB",
                );
            }
        };
        write!(f, "{why}; {SQLITE_FORMS}")
    }
}

/// The SQLite file a database setting names: the path of `sqlite://PATH` or of a bare path,
/// why the setting names no lasting file, or `None` for any other scheme (PostgreSQL's, or
/// one refused as unsupported).
pub fn sqlite_file(database: &str) -> Option<Result<&str, NotAFile>> {
    // A bare path, no `sqlite://`: taken as the file only where it cannot be a server meant.
    let bare = !database.starts_with("sqlite://");
    let path = match database.strip_prefix("sqlite://") {
        Some(path) => path,
        // Before the `://` test: `file:///x.db` is SQLite's URI, not an unknown scheme.
        None if starts_with_ignoring_case(database, "file:") => return Some(Err(NotAFile::Uri)),
        // `postgres:db` is not a file name anyone means: refused as an unsupported URL.
        None if database.contains("://")
            || starts_with_ignoring_case(database, "postgres:")
            || starts_with_ignoring_case(database, "postgresql:") =>
        {
            return None;
        }
        None if starts_with_ignoring_case(database, "sqlite:") => {
            return Some(Err(NotAFile::NoSlashes));
        }
        None => database,
    };
    Some(if path.trim().is_empty() {
        Err(NotAFile::Empty)
    } else if path.eq_ignore_ascii_case(":memory:") {
        Err(NotAFile::Memory)
    } else if starts_with_ignoring_case(path, "file:") {
        Err(NotAFile::Uri)
    } else if path.contains('?') {
        Err(NotAFile::Query)
    } else if bare && keywords(path) {
        Err(NotAFile::Keywords)
    } else if bare
        && path
            .split_once('@')
            .is_some_and(|(user, _)| user.contains(':'))
    {
        Err(NotAFile::Credentials)
    } else {
        Ok(path)
    })
}

/// Whether `setting` reads as PostgreSQL's key=value connection string: a word of it names
/// one of libpq's usual keywords.
fn keywords(setting: &str) -> bool {
    const KEYWORDS: [&str; 6] = [
        "host=",
        "hostaddr=",
        "port=",
        "user=",
        "password=",
        "dbname=",
    ];
    joined_pairs(setting)
        .split_whitespace()
        .any(|word| KEYWORDS.iter().any(|k| starts_with_ignoring_case(word, k)))
}

/// `setting` with the spaces libpq allows around `=` removed (`host = db` is `host=db`), so
/// that each `key=value` pair is one word.
pub(crate) fn joined_pairs(setting: &str) -> String {
    let mut joined = setting.to_owned();
    while joined.contains(" =") || joined.contains("= ") {
        joined = joined.replace(" =", "=").replace("= ", "=");
    }
    joined
}

fn starts_with_ignoring_case(text: &str, prefix: &str) -> bool {
    text.get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// The file a SQLite database URL names, when it names a lasting one.
pub(super) fn sqlite_path(database: &str) -> Option<&str> {
    sqlite_file(database).and_then(Result::ok)
}

/// Whether a database URL names PostgreSQL (`postgres://…` or `postgresql://…`); anything
/// else is SQLite, or refused for its unknown scheme.
pub fn is_postgres(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

/// Whether a store can be opened on the URL: a SQLite file (`sqlite://PATH` or a bare path) or
/// PostgreSQL. Configuration validation refuses any other before a command runs.
pub fn is_supported(database: &str) -> bool {
    is_postgres(database) || sqlite_path(database).is_some()
}

/// The database a URL names, for messages: a PostgreSQL URL without its user info and without
/// any password in its query; any URL that is not SQLite's only through `redact_url`.
pub fn describe(database: &str) -> String {
    if is_postgres(database) {
        return format!("PostgreSQL {}", crate::config::host_and_path(database));
    }
    match sqlite_file(database) {
        Some(Ok(path)) => format!("SQLite {path}"),
        Some(Err(_)) => format!(
            "SQLite setting {:?} naming no file",
            crate::config::redact_url(database)
        ),
        None => format!(
            "unsupported database {}",
            crate::config::redact_url(database)
        ),
    }
}

/// Whether `database` is a SQLite file that does not exist yet (opening it creates it).
pub fn sqlite_absent(database: &str) -> bool {
    sqlite_path(database).is_some_and(
        |p| matches!(std::fs::metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound),
    )
}

/// A SQLite path that no retry can open: a directory, or a file in a directory that does not
/// exist (SQLite creates the file, never its directory). SQLite says only "unable to open
/// database file", which reads as a store that is down (exit 4, retry later).
pub(super) fn lasting_problem(path: &str) -> anyhow::Result<()> {
    let file = std::path::Path::new(path);
    let why = if file.is_dir() {
        "is a directory: name a file in it, e.g. sqlite://DIR/oncebox.db".to_owned()
    } else {
        let dir = file.parent().filter(|p| !p.as_os_str().is_empty());
        match dir.map(|d| (d, std::fs::metadata(d))) {
            Some((_, Ok(m))) if m.is_dir() => return Ok(()),
            None => return Ok(()),
            Some((d, Err(e))) if e.kind() != std::io::ErrorKind::NotFound => {
                // One this user may not enter, say: not absent, and not to be created.
                format!("is in {}, which cannot be accessed: {e}", d.display())
            }
            Some((d, _)) => format!(
                "is in {}, which is not a directory that exists: create it first",
                d.display()
            ),
        }
    };
    Err(crate::exit::usage(format!("database {path} {why}")))
}

#[cfg(test)]
mod tests {
    use super::{NotAFile, describe, is_postgres, is_supported, sqlite_file};

    /// One test of the URL's scheme decides which store opens, which one a message names
    /// (without the password) and whether `[storage]` warns.
    #[test]
    fn postgres_is_told_by_its_two_schemes() {
        for url in [
            "postgres://u:secret@db:5432/x",
            "postgresql://u:secret@db/x",
            "postgres://db/x?user=u&password=secret",
        ] {
            assert!(is_postgres(url), "{url}");
            let said = describe(url);
            assert!(
                said.starts_with("PostgreSQL db") && !said.contains("secret"),
                "{said}"
            );
        }
        // A password pasted without percent-encoding is not shown either.
        for url in [
            "postgres://app:ab/s3cr3t@db/x",
            "postgres://app:ab?s3cr3t@db/x",
            "postgres://app:ab#s3cr3t@db/x",
        ] {
            assert_eq!(describe(url), "PostgreSQL db/x", "{url}");
        }
        for url in ["sqlite://postgres.db", "postgres.db"] {
            assert!(!is_postgres(url), "{url}");
            assert!(describe(url).starts_with("SQLite "), "{url}");
        }
        // Neither store's: named as such, through `redact_url`.
        for url in [
            "postgresx://u:secret@h/x",
            "./postgres://x",
            "mysql://secret@h/x",
        ] {
            assert!(!is_postgres(url) && !is_supported(url), "{url}");
            let said = describe(url);
            assert!(
                said.starts_with("unsupported database") && !said.contains("secret"),
                "{said}"
            );
        }
    }

    /// A SQLite setting is a lasting file or refused with the reason: no path (an unset
    /// variable), memory, a `file:` URI, a query that would join the file's name, or sqlx's
    /// `sqlite:` without `//`.
    #[test]
    fn a_sqlite_setting_names_a_lasting_file_or_why_not() {
        for (setting, path) in [
            ("sqlite://oncebox.db", "oncebox.db"),
            ("sqlite:///var/lib/oncebox/o.db", "/var/lib/oncebox/o.db"),
            ("oncebox.db", "oncebox.db"),
            ("./data/memory.db", "./data/memory.db"),
        ] {
            assert_eq!(sqlite_file(setting), Some(Ok(path)), "{setting}");
            assert!(is_supported(setting), "{setting}");
        }
        for (setting, why) in [
            ("sqlite://", NotAFile::Empty),
            ("sqlite://  ", NotAFile::Empty),
            ("sqlite://:memory:", NotAFile::Memory),
            (":memory:", NotAFile::Memory),
            ("file:o.db?mode=memory&cache=shared", NotAFile::Uri),
            ("FILE:o.db", NotAFile::Uri),
            ("file:///tmp/o.db", NotAFile::Uri),
            ("sqlite://file:o.db?mode=memory", NotAFile::Uri),
            ("sqlite://o.db?mode=memory", NotAFile::Query),
            ("sqlite://o.db?mode=rwc", NotAFile::Query),
            ("sqlite:oncebox.db", NotAFile::NoSlashes),
            ("sqlite::memory:", NotAFile::NoSlashes),
            ("sqlite:/abs/o.db", NotAFile::NoSlashes),
        ] {
            assert_eq!(sqlite_file(setting), Some(Err(why)), "{setting}");
            assert!(!is_supported(setting), "{setting}");
            assert!(why.to_string().contains("sqlite:///abs/path.db"), "{why}");
        }
        assert_eq!(sqlite_file("postgres://db/x"), None);
        // PostgreSQL's scheme without `//` is not taken as a file name either.
        for setting in ["postgres:db", "postgresql:db", "POSTGRES:db"] {
            assert_eq!(sqlite_file(setting), None, "{setting}");
            assert!(!is_supported(setting), "{setting}");
        }
        // Multi-byte text at the prefix's end is compared, not sliced through.
        assert_eq!(sqlite_file("file\u{e9}.db"), Some(Ok("file\u{e9}.db")));
    }
}
