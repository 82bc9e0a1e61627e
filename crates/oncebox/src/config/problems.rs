//! Validation problems: each `path: what`, with where its value came from when figment knows.

use std::fmt;

use anyhow::anyhow;
use figment::Figment;

use super::{Secrets, raw};

pub(super) fn invalid(problems: &[String]) -> anyhow::Error {
    match problems {
        [one] => anyhow!("invalid configuration: {one}"),
        many => anyhow!("invalid configuration:\n  {}", many.join("\n  ")),
    }
}

/// Validation problems, each `path: what` with where the value came from when figment knows.
pub(super) struct Problems<'f> {
    figment: &'f Figment,
    list: Vec<String>,
    /// Carried here because every validator that reads a secret already takes this.
    pub(super) secrets: Secrets,
}

impl<'f> Problems<'f> {
    pub(super) fn new(figment: &'f Figment, secrets: Secrets) -> Problems<'f> {
        Problems {
            figment,
            list: Vec::new(),
            secrets,
        }
    }

    pub(super) fn push(&mut self, path: &str, what: impl fmt::Display) {
        // `a.b[2]` is looked up as `a.b`: figment knows tables, not list items; `a.b (VAR)`
        // as `a.b`.
        let key = path.split(['[', ' ']).next().unwrap_or(path);
        let origin = self.origin(key);
        self.list.push(format!("{path}: {what}{origin}"));
    }

    /// Where the value at `key` came from, as ` (in FILE)` or ` (from …)`; nothing when that
    /// is not one place. Figment tags a table with the last provider that touched any of it,
    /// so a table whose fields came from the file and a variable (`[relay]` in the file,
    /// `ONCEBOX_RELAY__POLL` set) was said to come from a variable that does not exist
    /// (`ONCEBOX_RELAY`): a table is said to come from where all its fields came from.
    fn origin(&self, key: &str) -> String {
        let of = |key: &str| {
            self.figment
                .find_metadata(key)
                .map(|md| raw::origin(md, key))
                .unwrap_or_default()
        };
        let Ok(figment::value::Value::Dict(_, fields)) = self.figment.find_value(key) else {
            return of(key);
        };
        if fields.is_empty() {
            return of(key);
        }
        let mut origins = fields
            .keys()
            .map(|field| self.origin(&format!("{key}.{field}")));
        let first = origins.next().unwrap_or_default();
        if origins.all(|o| o == first) {
            first
        } else {
            String::new()
        }
    }

    /// Pushes `what` under `path`, a table that must set exactly one of `fields`, saying where
    /// each field set came from when they came from different layers: figment adds a layer's
    /// fields to a table the file set, so `event_id = { header = … }` in the file and
    /// `ONCEBOX_SOURCES__SHOP__EVENT_ID__POINTER` in the environment made a table with both,
    /// refused with nothing saying why it held two.
    pub(super) fn push_one_of(&mut self, path: &str, fields: &[&str], what: &str) {
        let set: Vec<(String, &str)> = fields
            .iter()
            .filter(|f| self.figment.find_value(&format!("{path}.{f}")).is_ok())
            .map(|f| (self.origin(&format!("{path}.{f}")), *f))
            .collect();
        let layered = set.windows(2).any(|w| w[0].0 != w[1].0);
        if !layered {
            return self.push(path, what);
        }
        let each: Vec<String> = set.iter().map(|(o, f)| format!("{f}{o}")).collect();
        self.push(
            path,
            format_args!(
                "{what}; the layers were merged, a table in the environment adding to the \
                 file's: {}; unset the one not meant",
                each.join(", ")
            ),
        );
    }

    /// Whether the value at `key` was written in a configuration file (not a variable, not a
    /// flag, not a default).
    pub(super) fn in_file(&self, key: &str) -> bool {
        self.figment
            .find_metadata(key)
            .is_some_and(|md| matches!(md.source, Some(figment::Source::File(_))))
    }

    pub(super) fn count(&self) -> usize {
        self.list.len()
    }

    pub(super) fn finish(self) -> Result<(), Vec<String>> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(self.list)
        }
    }
}
