//! Signing keys configured in two places: a key shared by two sources, or a route signing with
//! a source's key, refused by name, never by value.

use std::collections::BTreeMap;

use oncebox_core::Source;
use oncebox_core::route::Route;
use oncebox_core::signature::Secret;
use oncebox_gateway::policy::SourcePolicy;

use super::Problems;
use super::source::source_path;

/// Refuses every source whose key another source also has, and every route that signs with a
/// source's key. Keys are compared decoded (`Secret::same_key`), so writing one as `whsec_…`
/// and once as bare base64, inline or through a variable, does not hide the reuse.
///
/// Why refused, not warned: a request signed for one source, replayed to the other's URL,
/// passes its check (the event reaches the other source's routes), and a route's signed
/// delivery is a valid request to the source holding its key (an event sent back in).
pub(super) fn refuse_shared_keys(
    sources: &BTreeMap<Source, SourcePolicy>,
    routes: &[Route],
    p: &mut Problems<'_>,
) {
    let keyed: Vec<(&Source, &[Secret])> = sources
        .iter()
        .map(|(name, policy)| (name, policy.secrets.as_slice()))
        .collect();
    for (i, (name, secrets)) in keyed.iter().enumerate() {
        // Each pair once, told at the later source and naming the earlier.
        for (earlier, theirs) in &keyed[..i] {
            if shares(secrets, theirs) {
                p.push(
                    &format!("{}.secrets", source_path(name.as_str())),
                    format_args!(
                        "a secret of this source is also one of {} (the value is not shown): a \
                         request signed for either would be accepted by both; give each source \
                         its own",
                        source_path(earlier.as_str())
                    ),
                );
            }
        }
    }
    for route in routes {
        let Some(signing) = &route.signing_secret else {
            continue;
        };
        for (name, secrets) in &keyed {
            if shares(std::slice::from_ref(signing), secrets) {
                p.push(
                    &format!("routes.{}", route.name),
                    format_args!(
                        "its signing secret is also a secret of {} (the value is not shown): \
                         each signed delivery would be a valid request to that source; sign \
                         with a key of its own",
                        source_path(name.as_str())
                    ),
                );
            }
        }
    }
}

fn shares(ours: &[Secret], theirs: &[Secret]) -> bool {
    ours.iter().any(|a| theirs.iter().any(|b| a.same_key(b)))
}
