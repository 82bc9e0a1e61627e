//! The invariant check `oncebox bench` ends with, against what the gateway stored: every
//! accepted key stored once, nothing stored that was not accepted.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result, bail};
use oncebox_core::Source;
use serde::Deserialize;

use super::{ConnectionReport, KeyState, PAGE, REQUEST_TIMEOUT, SHOWN};

#[derive(Deserialize)]
struct EventsPage {
    items: Vec<EventItem>,
    next: Option<String>,
}

#[derive(Deserialize)]
struct EventItem {
    event_id: String,
}

/// Every event id stored for `source`, in arrival order, repeats included.
pub(super) async fn stored_ids(
    base: &str,
    source: &Source,
    token: Option<&str>,
) -> Result<Vec<String>> {
    let client = crate::client::http()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let url = format!("{base}/v1/events");
    // For messages: `--url` may carry credentials (`http://user:token@host`).
    let shown = crate::config::redact_url(&url);
    let limit = PAGE.to_string();
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("source", source.as_str()), ("limit", limit.as_str())];
        if let Some(cursor) = &after {
            query.push(("after", cursor.as_str()));
        }
        let mut request = client.get(&url).query(&query);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("GET {shown} for the invariant check"))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            bail!(
                "GET {shown} for the invariant check: {status}: {text} (is --admin-token needed?)"
            );
        }
        let page: EventsPage = response
            .json()
            .await
            .with_context(|| format!("GET {shown}: unexpected listing"))?;
        ids.extend(page.items.into_iter().map(|i| i.event_id));
        match page.next {
            // A cursor that does not move would loop forever.
            Some(next) if after.as_ref() != Some(&next) => after = Some(next),
            Some(next) => bail!("GET {shown}: the cursor did not advance past {next}"),
            None => return Ok(ids),
        }
    }
}

/// Compares what the gateway stored with what it answered: every key answered 2xx stored
/// exactly once, nothing stored that was refused, no key accepted twice.
pub(super) fn check(
    out: &mut impl Write,
    reports: &[ConnectionReport],
    stored: &[String],
) -> Result<bool> {
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for id in stored {
        *copies.entry(id.as_str()).or_default() += 1;
    }
    let keys: HashMap<&str, &KeyState> = reports
        .iter()
        .flat_map(|r| r.keys.iter().map(|(k, s)| (k.as_str(), s)))
        .collect();
    let mut missing: Vec<&str> = keys
        .iter()
        .filter(|(k, s)| s.acked && !copies.contains_key(*k))
        .map(|(k, _)| *k)
        .collect();
    let mut twice: Vec<&str> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| *k)
        .collect();
    // Ours, stored, never answered 2xx, and not of unknown outcome either: refused yet kept.
    let mut unacked: Vec<&str> = keys
        .iter()
        .filter(|(k, s)| !s.acked && !s.uncertain && copies.contains_key(*k))
        .map(|(k, _)| *k)
        .collect();
    let mut reaccepted: Vec<&str> = reports
        .iter()
        .flat_map(|r| r.reaccepted.iter().map(String::as_str))
        .collect();
    let mut refused_again: Vec<&str> = reports
        .iter()
        .flat_map(|r| r.refused_again.iter().map(String::as_str))
        .collect();
    let unknown_stored = keys
        .iter()
        .filter(|(k, s)| !s.acked && s.uncertain && copies.contains_key(*k))
        .count();
    // Ids in the source that this run did not send (an earlier run into a configured source).
    let foreign = copies.keys().filter(|k| !keys.contains_key(*k)).count();
    if unknown_stored > 0 {
        writeln!(
            out,
            "note: {unknown_stored} keys of unknown outcome (no answer or 503) were stored"
        )?;
    }
    if foreign > 0 {
        writeln!(
            out,
            "note: {foreign} keys in the source were not sent by this run"
        )?;
    }
    let ours = keys.keys().filter(|k| copies.contains_key(*k)).count();
    let mut ok = true;
    for (what, list) in [
        ("accepted (2xx) but not stored", &mut missing),
        ("stored more than once", &mut twice),
        ("stored but refused (no 2xx)", &mut unacked),
        (
            "accepted again without Idempotent-Replayed",
            &mut reaccepted,
        ),
        (
            "accepted, then refused when sent again unchanged",
            &mut refused_again,
        ),
    ] {
        if list.is_empty() {
            continue;
        }
        ok = false;
        list.sort_unstable();
        // A key resent several times is named once.
        list.dedup();
        let shown: Vec<&str> = list.iter().take(SHOWN).copied().collect();
        writeln!(
            out,
            "invariant: {} keys {what}: {}{}",
            list.len(),
            shown.join(", "),
            if list.len() > SHOWN { ", …" } else { "" }
        )?;
    }
    if ok {
        writeln!(out, "invariant: ok ({ours} keys)")?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One connection that sent `keys` with the given (acked, uncertain), and `reaccepted`.
    fn report(keys: &[(&str, bool, bool)], reaccepted: &[&str]) -> ConnectionReport {
        ConnectionReport {
            keys: keys
                .iter()
                .map(|(k, acked, uncertain)| {
                    let state = KeyState {
                        acked: *acked,
                        uncertain: *uncertain,
                    };
                    ((*k).to_owned(), state)
                })
                .collect(),
            reaccepted: reaccepted.iter().map(|k| (*k).to_owned()).collect(),
            ..ConnectionReport::default()
        }
    }

    fn checked(reports: &[ConnectionReport], stored: &[&str]) -> (bool, String) {
        let stored: Vec<String> = stored.iter().map(|s| (*s).to_owned()).collect();
        let mut out = Vec::new();
        let ok = check(&mut out, reports, &stored).unwrap();
        (ok, String::from_utf8(out).unwrap())
    }

    #[test]
    fn every_accepted_key_stored_once_passes() {
        let reports = [report(&[("a", true, false), ("b", true, false)], &[])];
        assert_eq!(
            checked(&reports, &["a", "b"]),
            (true, "invariant: ok (2 keys)\n".into())
        );
    }

    #[test]
    fn each_broken_invariant_is_named_with_its_keys() {
        let mut turned = report(&[("turned", true, false)], &[]);
        turned.refused_again.push("turned".into());
        let reports = [
            report(&[("lost", true, false), ("twice", true, false)], &[]),
            report(&[("refused", false, false)], &["again"]),
            turned,
        ];
        let (ok, out) = checked(&reports, &["twice", "twice", "refused", "again", "turned"]);
        assert!(!ok, "{out}");
        for line in [
            "invariant: 1 keys accepted (2xx) but not stored: lost",
            "invariant: 1 keys stored more than once: twice",
            "invariant: 1 keys stored but refused (no 2xx): refused",
            "invariant: 1 keys accepted again without Idempotent-Replayed: again",
            "invariant: 1 keys accepted, then refused when sent again unchanged: turned",
        ] {
            assert!(out.contains(line), "{line:?} in {out}");
        }
    }

    /// A key without an answer (or with a 503) may be stored or not; a stranger's key in the
    /// source is not this run's. Both are told, neither fails the check.
    #[test]
    fn unknown_outcomes_and_foreign_keys_are_notes() {
        let reports = [report(&[("a", true, false), ("maybe", false, true)], &[])];
        let (ok, out) = checked(&reports, &["a", "maybe", "earlier-run"]);
        assert!(ok, "{out}");
        assert!(out.contains("note: 1 keys of unknown outcome"), "{out}");
        assert!(
            out.contains("note: 1 keys in the source were not sent"),
            "{out}"
        );
        assert!(out.contains("invariant: ok (2 keys)"), "{out}");
    }
}
