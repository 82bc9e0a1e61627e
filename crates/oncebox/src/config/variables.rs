//! `ONCEBOX_…` variables that configure nothing: each is named, with the name it most likely
//! meant. A mistyped one used to be skipped, so `ONCEBOX_DATABASE_URL=postgres://…` ran the
//! gateway on a local SQLite file that a container restart loses.

use std::collections::BTreeSet;

use serde::de::{self, DeserializeOwned};

const PREFIX: &str = "ONCEBOX_";

/// The warning for a table `name` (a route, a source or a consumer, at `path`) that no
/// `ONCEBOX_…` variable can reach: variables' names are lower-cased, and a `.` or a `__` in
/// them separates tables. `None` for a name of a-z, 0-9, `_` and `-` without `__` in it or a
/// `_` at its end (`ORDERS___TIMEOUT` reads as `orders` and `_timeout`).
pub(super) fn unreachable(path: &str, kind: &str, name: &str) -> Option<String> {
    let reachable = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b))
        && !name.contains("__")
        && !name.ends_with('_');
    (!reachable).then(|| {
        format!(
            "{path}: the environment cannot override this {kind}'s settings (its variables are \
             lower-cased, and a '.' or '__' in them separates tables); a name of a-z, 0-9, '_' \
             and '-', with no '__' and no '_' at its end, can be"
        )
    })
}

/// Variables read whole (after the prefix): by the configuration's layers, and by clap for
/// `consume`'s broker URLs.
const SETTINGS: &[&str] = &[
    "CONFIG",
    "LISTEN",
    "DATABASE",
    "ADMIN_TOKEN",
    "AMQP_URL",
    "NATS_URL",
];

/// Not configuration, but set for themselves by this repository's tests, benches and
/// `.ci/run`, and inherited by every `oncebox` those start: refusing them would stop the
/// suites (and a developer's shell holding them) from running the binary at all. Keep in step
/// with `grep -rn 'ONCEBOX_' crates .ci`; a new harness variable belongs here.
const HARNESS: &[&str] = &[
    // The services the suites talk to, and whether a missing one fails instead of skipping.
    "POSTGRES_URL",
    "REDIS_URL",
    "REQUIRE_SERVICES",
    "PG_BIN",
    "REDIS_SERVER",
    "NATS_SERVER",
    // Randomized scenarios' seed, the longer soak, the outage test's length, bench output.
    "SEED",
    "SOAK",
    "OUTAGE_SECS",
    "BENCH_DIR",
    // Test binaries re-run as their own child processes, marked by one of these.
    "RELAY_CHILD",
    "CRASH_CHILD",
    "POWERLOSS_CHILD",
    "PLACEMENT_CHILD",
    "AMQP_CHILD",
    "NATS_CHILD",
    "FAULTS_CHILD",
    "FAULTS_NATS_CHILD",
    "FAULTS_LEASE_CHILD",
];

/// The tables `ONCEBOX_<TABLE>__<KEY>` variables set, and whether a name comes between the
/// table and the key (`ONCEBOX_SOURCES__SHOP__TOLERANCE`), with their fields as serde knows
/// them.
fn tables() -> [(&'static str, bool, &'static [&'static str]); 6] {
    use super::{consumer::RawConsumer, raw, route::RawRoute, storage::RawStorage};
    [
        ("limits", false, fields::<raw::RawLimits>()),
        ("sources", true, fields::<raw::RawSource>()),
        ("storage", false, fields::<RawStorage>()),
        ("routes", true, fields::<RawRoute>()),
        ("relay", false, fields::<raw::RawRelay>()),
        ("consumers", true, fields::<RawConsumer>()),
    ]
}

/// The table names, for the environment layer's filter.
pub(super) fn table_names() -> impl Iterator<Item = &'static str> {
    tables().into_iter().map(|(name, _, _)| name)
}

/// One problem per `ONCEBOX_…` variable in `vars` that is neither a setting, nor under a
/// table, nor a harness's own, nor a secret variable the configuration names (`referenced`).
pub(super) fn unknown<'v>(
    vars: impl IntoIterator<Item = &'v str>,
    referenced: &BTreeSet<&str>,
) -> Vec<(String, String)> {
    vars.into_iter()
        .filter(|var| var.to_ascii_uppercase().starts_with(PREFIX))
        .filter(|var| !known(var) && !referenced.contains(var))
        .map(|var| {
            let empty_part = var
                .to_ascii_uppercase()
                .strip_prefix(PREFIX)
                .is_some_and(|rest| rest.split("__").any(str::is_empty));
            let why = if empty_part {
                "a part of its name is empty (a template's variable left unset?), and such a \
                 setting is never read; name every part or unset it"
                    .to_owned()
            } else {
                let hint = suggest(var)
                    .filter(|s| !s.eq_ignore_ascii_case(var))
                    .map_or_else(String::new, |s| format!(" (did you mean {s}?)"));
                format!("unknown variable: oncebox reads no such setting{hint}; rename or unset it")
            };
            (var.to_owned(), why)
        })
        .collect()
}

fn known(var: &str) -> bool {
    // Read by their exact names.
    if let Some(rest) = var.strip_prefix(PREFIX)
        && (SETTINGS.contains(&rest) || HARNESS.contains(&rest))
    {
        return true;
    }
    // figment matches the prefix and the table case-insensitively; the key below the table
    // is checked when the configuration is read (`sources.shop.tolerans` is refused there).
    // A name with an empty part (`ONCEBOX_ROUTES____TIMEOUT`, a template's unset `${R}`)
    // is dropped by figment without a word: unknown here, so it is refused instead.
    let upper = var.to_ascii_uppercase();
    upper
        .strip_prefix(PREFIX)
        .filter(|rest| rest.split("__").all(|part| !part.is_empty()))
        .and_then(|rest| rest.split_once("__"))
        .is_some_and(|(table, _)| table_names().any(|t| t.eq_ignore_ascii_case(table)))
}

/// The variable `var` most likely meant, if one is close.
fn suggest(var: &str) -> Option<String> {
    let upper = var.to_ascii_uppercase();
    let rest = upper.strip_prefix(PREFIX)?;
    // `ONCEBOX_DATABASE_URL` for `ONCEBOX_DATABASE`, `ONCEBOX_ADMINTOKEN` for `…_ADMIN_TOKEN`.
    let setting = SETTINGS.iter().find(|s| {
        rest.strip_prefix(**s)
            .is_some_and(|tail| tail.starts_with('_'))
            || strsim::levenshtein(rest, s) <= close(s)
    });
    if let Some(s) = setting {
        return Some(format!("{PREFIX}{s}"));
    }
    for (table, named, fields) in tables() {
        let table_upper = table.to_ascii_uppercase();
        // `SOURCE__SHOP__TOLERANCE`: the table mistyped, the nesting right.
        if let Some((head, tail)) = rest.split_once("__")
            && strsim::levenshtein(head, &table_upper) <= close(&table_upper)
        {
            return Some(format!("{PREFIX}{table_upper}__{tail}"));
        }
        // `SOURCES_SHOP_TOLERANCE`: one underscore where the nesting takes two. The key is
        // the longest known field the name ends with.
        let Some(tail) = rest
            .strip_prefix(table_upper.as_str())
            .and_then(|t| t.strip_prefix('_'))
        else {
            continue;
        };
        let field = fields
            .iter()
            .map(|f| f.to_ascii_uppercase())
            .filter(|f| tail == f || tail.ends_with(&format!("_{f}")))
            .max_by_key(String::len);
        return Some(match (named, field) {
            (false, _) => format!("{PREFIX}{table_upper}__{tail}"),
            (true, Some(f)) if tail.len() > f.len() => {
                let name = &tail[..tail.len() - f.len() - 1];
                format!("{PREFIX}{table_upper}__{name}__{f}")
            }
            (true, _) => format!("{PREFIX}{table_upper}__<NAME>__<KEY>"),
        });
    }
    None
}

/// Edits allowed for a name to count as close: one in a short name, two in a longer one.
fn close(name: &str) -> usize {
    if name.len() <= 5 { 1 } else { 2 }
}

/// The fields serde knows for `T`, a `deny_unknown_fields` struct: asked by offering it a key
/// it cannot have, so the lists never drift from the structs.
fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    #[derive(Debug)]
    struct Fields(&'static [&'static str]);
    impl std::fmt::Display for Fields {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields")
        }
    }
    impl std::error::Error for Fields {}
    impl de::Error for Fields {
        fn custom<M: std::fmt::Display>(_: M) -> Fields {
            Fields(&[])
        }
        fn unknown_field(_: &str, expected: &'static [&'static str]) -> Fields {
            Fields(expected)
        }
    }
    let probe = de::value::MapDeserializer::<_, Fields>::new(std::iter::once(("\u{0}", ())));
    T::deserialize(probe).err().map_or(&[], |Fields(f)| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(var: &str) -> Option<String> {
        assert!(!known(var), "{var} is known");
        suggest(var)
    }

    #[test]
    fn misspelled_variables_are_named_with_what_they_meant() {
        for (var, meant) in [
            ("ONCEBOX_DATABASE_URL", "ONCEBOX_DATABASE"),
            ("ONCEBOX_ADMINTOKEN", "ONCEBOX_ADMIN_TOKEN"),
            ("ONCEBOX_LISTN", "ONCEBOX_LISTEN"),
            ("oncebox_database", "ONCEBOX_DATABASE"),
            (
                "ONCEBOX_SOURCE__SHOP__TOLERANCE",
                "ONCEBOX_SOURCES__SHOP__TOLERANCE",
            ),
            (
                "ONCEBOX_SOURCES_SHOP_TOLERANCE",
                "ONCEBOX_SOURCES__SHOP__TOLERANCE",
            ),
            (
                "ONCEBOX_ROUTES_MY_HOOK_SIGNING_SECRET_ENV",
                "ONCEBOX_ROUTES__MY_HOOK__SIGNING_SECRET_ENV",
            ),
            (
                "ONCEBOX_STORAGE_RECENT_ANSWERS",
                "ONCEBOX_STORAGE__RECENT_ANSWERS",
            ),
        ] {
            assert_eq!(hint(var).as_deref(), Some(meant), "{var}");
        }
        assert_eq!(hint("ONCEBOX_TEST_WHATEVER"), None);
    }

    #[test]
    fn settings_tables_harness_and_named_secrets_are_known() {
        let referenced = BTreeSet::from(["ONCEBOX_SHOP_SECRET"]);
        let vars = [
            "ONCEBOX_DATABASE",
            "ONCEBOX_CONFIG",
            "ONCEBOX_SOURCES__SHOP__TOLERANCE",
            "ONCEBOX_POSTGRES_URL",
            "ONCEBOX_REQUIRE_SERVICES",
            "ONCEBOX_AMQP_URL",
            "ONCEBOX_NATS_SERVER",
            "ONCEBOX_SHOP_SECRET",
            "PATH",
        ];
        assert_eq!(unknown(vars, &referenced), Vec::new());
        // The last: a template's unset `${R}` left a part empty, which figment drops unread.
        let found = unknown(
            [
                "ONCEBOX_RELAY_BATCH",
                "ONCEBOX_TEST_WHATEVER",
                "ONCEBOX_ROUTES____TIMEOUT",
            ],
            &referenced,
        );
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found[2].1.contains("a part of its name is empty"),
            "{found:?}"
        );
        assert!(found[0].1.contains("ONCEBOX_RELAY__BATCH"), "{found:?}");
    }

    #[test]
    fn field_lists_come_from_the_structs() {
        let sources = fields::<super::super::raw::RawSource>();
        assert!(sources.contains(&"tolerance") && sources.contains(&"secrets_env"));
        assert!(tables().iter().all(|(_, _, f)| !f.is_empty()));
    }
}
