//! The layers of the configuration in their order of precedence: `oncebox.toml` (or the file
//! `--config` / `ONCEBOX_CONFIG` names), then `ONCEBOX_…` variables, then flags.

use std::path::{Path, PathBuf};

use anyhow::bail;
use figment::providers::{Env, Format as _, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::Overrides;

const DEFAULT_FILE: &str = "oncebox.toml";
/// The origin of values set through `ONCEBOX_<TABLE>__<KEY>…` variables: `raw::origin` names
/// the variable of a field from its path when a value's metadata has this name.
pub(super) const NESTED_ENV: &str = "ONCEBOX_ environment variables";

/// Top-level strings read verbatim. Through the generic provider a token of only digits, or
/// `true`, would be coerced to a number or a boolean and then refused or mangled.
const ENV_STRINGS: &[(&str, &str)] = &[
    ("ONCEBOX_LISTEN", "listen"),
    ("ONCEBOX_DATABASE", "database"),
    ("ONCEBOX_ADMIN_TOKEN", "admin_token"),
];

pub(super) fn layers(overrides: &Overrides) -> anyhow::Result<Figment> {
    let mut figment = Figment::new();
    if let Some(file) = config_file(overrides)? {
        // `file_exact`: plain `file` would also search every parent directory.
        figment = figment.merge(Toml::file_exact(file));
    }
    // Only the tables: the prefix is shared with variables that are not configuration data
    // (`ONCEBOX_CONFIG` names the file, test harnesses set their own), which `variables`
    // tells apart from mistyped ones. Matched whole: `ONCEBOX_RELAY_CHILD` is `relay_child`,
    // not the `relay` table.
    // figment reads variables lossily: a stray byte in a secret would become U+FFFD and
    // change the key, every event then `401` with nothing pointing at the variable.
    for (var, value) in std::env::vars_os() {
        // The prefix matched as figment matches it: case aside, the name trimmed.
        let table = var
            .to_str()
            .map(str::trim)
            .and_then(|v| {
                v.get(..8)
                    .filter(|p| p.eq_ignore_ascii_case("ONCEBOX_"))
                    .and(v.get(8..))
            })
            .is_some_and(|rest| {
                let top = rest.split("__").next().unwrap_or_default();
                rest.contains("__")
                    && super::variables::table_names().any(|t| t.eq_ignore_ascii_case(top))
            });
        if table && value.to_str().is_none() {
            bail!(
                "invalid configuration: environment variable {} is not valid UTF-8",
                var.to_string_lossy()
            );
        }
    }
    figment = figment.merge(NestedEnv(Env::prefixed("ONCEBOX_").split("__").filter(
        |key| {
            let top = key.as_str().split('.').next().unwrap_or_default();
            super::variables::table_names().any(|t| t.eq_ignore_ascii_case(top))
        },
    )));
    for (var, key) in ENV_STRINGS {
        if let Some(value) = std::env::var_os(var) {
            let Ok(value) = value.into_string() else {
                bail!("invalid configuration: environment variable {var} is not valid UTF-8");
            };
            figment = figment.merge(Verbatim::new(
                key,
                value,
                format!("environment variable {var}"),
            ));
        }
    }
    let flags = [
        (
            "listen",
            overrides.listen.map(|a| a.to_string()),
            "--listen",
        ),
        ("database", overrides.database.clone(), "--database"),
        (
            "admin_token",
            overrides.admin_token.clone(),
            "--admin-token",
        ),
    ];
    for (key, value, flag) in flags {
        if let Some(value) = value {
            figment = figment.merge(Verbatim::new(key, value, format!("flag {flag}")));
        }
    }
    Ok(figment)
}

/// `--config`, else `ONCEBOX_CONFIG`, else `./oncebox.toml` when present. A file that was named
/// explicitly must exist, and one present must be a file: silently starting in zero-config mode
/// would open the gateway.
fn config_file(overrides: &Overrides) -> anyhow::Result<Option<PathBuf>> {
    if let Some(path) = &overrides.config {
        return must_exist(path, "--config").map(Some);
    }
    if let Some(path) = std::env::var_os("ONCEBOX_CONFIG") {
        // Set but empty is a template whose variable was not filled in (`ONCEBOX_CONFIG=${CFG}`):
        // read as unset, it would start the gateway without its sources.
        if path.is_empty() {
            bail!("ONCEBOX_CONFIG is set but empty: name the configuration file, or unset it");
        }
        return must_exist(Path::new(&path), "ONCEBOX_CONFIG").map(Some);
    }
    // Absent means zero-config. Anything else there (a directory, a link to nothing: a
    // container whose configuration mount went missing) must be a readable file, for the same
    // reason as a named one.
    let default = Path::new(DEFAULT_FILE);
    match std::fs::symlink_metadata(default) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => must_exist(default, "the working directory").map(Some),
    }
}

fn must_exist(path: &Path, named_by: &str) -> anyhow::Result<PathBuf> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(path.to_path_buf()),
        Ok(_) => bail!(
            "config file {} (from {named_by}) is not a file",
            path.display()
        ),
        Err(e) => bail!("config file {} (from {named_by}): {e}", path.display()),
    }
}

/// One top-level string from the environment or a flag, kept exactly as given.
struct Verbatim {
    key: &'static str,
    value: String,
    origin: String,
}

impl Verbatim {
    fn new(key: &'static str, value: String, origin: String) -> Verbatim {
        Verbatim { key, value, origin }
    }
}

impl Provider for Verbatim {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.origin.clone())
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        let dict = Dict::from([(self.key.to_owned(), Value::from(self.value.clone()))]);
        Ok(Map::from([(Profile::Default, dict)]))
    }
}

/// figment's `Env` under the name [`NESTED_ENV`]: its own metadata names only the prefix, so a
/// message could not say which variable held the bad value.
struct NestedEnv(Env);

impl Provider for NestedEnv {
    fn metadata(&self) -> Metadata {
        Metadata::named(NESTED_ENV)
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        self.0.data()
    }
}
