//! A source's signing secrets: inline ones, then those its `secrets_env` names, parsed for its
//! scheme, read only by the commands that use them; no message ever shows a value.

use oncebox_core::signature::{Scheme, Secret};

use super::Problems;
use super::raw::RawSource;

/// Inline `secrets` then the values of the `secrets_env` variables, parsed for `scheme`.
/// Messages name the field, and the variable once it is known to be one; never a value.
pub(super) fn secrets(
    path: &str,
    raw: &RawSource,
    scheme: &Scheme,
    p: &mut Problems<'_>,
) -> Vec<Secret> {
    // Each with whether it stands in the file (`values::usable_secret`).
    let written = p.in_file(&format!("{path}.secrets"));
    let mut configured: Vec<(String, String, bool)> = raw
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("{path}.secrets[{i}]"), s.clone(), written))
        .collect();
    // Not read for a command that never verifies: with only variables listed, the source
    // then holds no secret, and nothing that command does asks for one.
    let read_env = if p.secrets.inbound() {
        raw.secrets_env.as_slice()
    } else {
        &[]
    };
    for (i, var) in read_env.iter().enumerate() {
        if let Some((at, value)) = secret_from_env(&format!("{path}.secrets_env[{i}]"), var, p) {
            configured.push((at, value, false));
        }
    }
    let any_listed = !raw.secrets.is_empty() || !raw.secrets_env.is_empty();
    if *scheme == Scheme::None {
        if any_listed {
            p.push(
                &format!("{path}.secrets"),
                "signature \"none\" takes no secrets",
            );
        }
        return Vec::new();
    }
    if !any_listed {
        p.push(
            &format!("{path}.secrets"),
            format_args!(
                "required for signature \"{}\" (set secrets or secrets_env)",
                scheme.name()
            ),
        );
        return Vec::new();
    }
    let instead = format!("list the variable holding it in {path}.secrets_env instead");
    configured
        .iter()
        .filter_map(|(at, value, written)| {
            if !super::values::usable_secret(at, value, &instead, *written, p) {
                return None;
            }
            Secret::parse(scheme, value).map_err(|e| p.push(at, e)).ok()
        })
        .collect()
}

/// The value of the environment variable `var` that the field at `at` names, with the field
/// and variable to name in a message about the value; `None` after pushing why not.
///
/// A name that is not set is not shown: it is as likely a secret typed where its variable's
/// name belongs (`secrets_env = ["whsec_…"]`), and the field's path already says which entry
/// to fix. A variable that is set is one, and naming it helps.
pub(super) fn secret_from_env(
    at: &str,
    var: &str,
    p: &mut Problems<'_>,
) -> Option<(String, String)> {
    // Such a name cannot be set, and the standard library would refuse to look it up.
    if var.is_empty() || var.contains(['=', '\0']) {
        p.push(
            at,
            "not an environment variable name (the value is not shown)",
        );
        return None;
    }
    match std::env::var_os(var).map(std::ffi::OsString::into_string) {
        None => {
            p.push(
                at,
                "names an environment variable that is not set (the name is not shown: it may \
                 be a secret typed in its place)",
            );
            None
        }
        Some(Err(_)) => {
            p.push(
                at,
                format_args!("environment variable {var} is not valid UTF-8"),
            );
            None
        }
        Some(Ok(value)) => Some((format!("{at} ({var})"), value)),
    }
}
