//! The checker's self-tests: a clean history is all zero, and each deliberately broken variant
//! is caught by the figure meant for it and no other.

use super::*;
use crate::history::{History, key};

/// Two keys delivered, the second twice (a retry answered as a replay), with their effects and
/// records stamped at the time of the commit.
fn clean() -> (History, Final) {
    let h = History::new();
    h.invoke(key("shop", "e1"), "v1", Some("shop")).ok(false);
    h.invoke(key("shop", "e2"), "v1", None).info("HTTP 503");
    h.invoke(key("shop", "e2"), "v1", None).ok(true);
    let mut fin = Final::default();
    for id in ["e1", "e2"] {
        fin.effects.insert(key("shop", id), vec!["v1".into()]);
        fin.records.insert(key("shop", id), vec![Some(0)]);
    }
    (h, fin)
}

fn figures(h: &History, fin: &Final) -> [usize; 6] {
    check(&h.ops(), fin).counts()
}

#[test]
fn a_clean_history_has_every_figure_at_zero() {
    let (h, fin) = clean();
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [0; 6], "{f}");
    assert_eq!((f.ok, f.replays, f.infos), (2, 1, 1));
    assert!(f.unresolved.is_empty());
    assert_eq!(f.conflicts(), "0/0");
    f.assert_clean("clean", 0);
}

#[test]
fn double_apply_is_d() {
    let (h, mut fin) = clean();
    fin.effects
        .get_mut(&key("shop", "e1"))
        .unwrap()
        .push("v1".into());
    assert_eq!(figures(&h, &fin), [1, 0, 0, 0, 0, 0]);
    let (h, mut fin) = clean();
    fin.records
        .get_mut(&key("shop", "e2"))
        .unwrap()
        .push(Some(1));
    assert_eq!(figures(&h, &fin), [1, 0, 0, 0, 0, 0]);
}

/// Applied twice into a store that keeps one record per key: the second overwrote the first,
/// and only the answers tell.
#[test]
fn a_key_answered_as_new_twice_is_d() {
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v1", Some("shop")).ok(false);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [1, 0, 0, 0, 0, 0], "{f}");
    assert!(f.d[0].contains("answered as new 2 times"), "{f}");
}

#[test]
fn two_payloads_applied_under_one_key_are_d() {
    // The second payload's sender never heard back (a 503): only the store's state tells.
    let (h, mut fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop"))
        .info("HTTP 503");
    fin.effects
        .get_mut(&key("shop", "e1"))
        .unwrap()
        .push("v2".into());
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [1, 0, 0, 0, 0, 0], "{f}");
    assert!(f.d[0].contains("another payload applied"), "{f}");
    assert_eq!(f.conflicts(), "0/0", "no sender was answered either way");
    // Acknowledged too: the answer is also a conflict injected and not detected.
    let (h, mut fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop")).ok(false);
    fin.effects
        .get_mut(&key("shop", "e1"))
        .unwrap()
        .push("v2".into());
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [1, 0, 0, 0, 1, 0], "{f}");
    assert_eq!(f.conflicts(), "0/1");
}

#[test]
fn lost_acknowledged_event_is_l_and_p() {
    let (h, mut fin) = clean();
    // The effect and the record of an acknowledged key are gone (a lost commit).
    fin.effects.remove(&key("shop", "e1"));
    fin.records.remove(&key("shop", "e1"));
    assert_eq!(figures(&h, &fin), [0, 1, 0, 1, 0, 0]);
    // Only the effect is gone (a relay that never delivered): L alone.
    let (h, mut fin) = clean();
    fin.effects.remove(&key("shop", "e1"));
    assert_eq!(figures(&h, &fin), [0, 1, 0, 0, 0, 0]);
}

#[test]
fn duplicate_answer_for_an_uncommitted_key_is_f() {
    // A first delivery answered as a replay: nobody could have committed it before.
    let (h, mut fin) = clean();
    h.invoke(key("shop", "e3"), "v1", None).ok(true);
    fin.effects.insert(key("shop", "e3"), vec!["v1".into()]);
    fin.records.insert(key("shop", "e3"), vec![Some(0)]);
    assert_eq!(figures(&h, &fin), [0, 0, 1, 0, 0, 0]);
    // A replay answered before the only commit's stamp.
    let (h, mut fin) = clean();
    fin.records.insert(key("shop", "e2"), vec![Some(i64::MAX)]);
    assert_eq!(figures(&h, &fin), [0, 0, 1, 0, 0, 0]);
    // An earlier delivery that was refused (401) could not have committed it.
    let h2 = History::new();
    h2.invoke(key("shop", "e4"), "v1", Some("other"))
        .fail(Refusal::Unauthorized);
    h2.invoke(key("shop", "e4"), "v1", Some("shop")).ok(true);
    let mut fin = Final::default();
    fin.effects.insert(key("shop", "e4"), vec!["v1".into()]);
    fin.records.insert(key("shop", "e4"), vec![None]);
    assert_eq!(figures(&h2, &fin), [0, 0, 1, 0, 0, 0]);
}

#[test]
fn acknowledgement_before_the_commit_is_p() {
    let (h, mut fin) = clean();
    fin.records.insert(key("shop", "e1"), vec![Some(i64::MAX)]);
    assert_eq!(figures(&h, &fin), [0, 0, 0, 1, 0, 0]);
}

#[test]
fn conflicts_detected_unlike_conflicts_injected_are_c() {
    // Another payload for a committed key acknowledged: an injected conflict missed.
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop")).ok(true);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [0, 0, 0, 0, 1, 0], "{f}");
    assert_eq!(f.conflicts(), "0/1");
    assert!(!f.clean(0));
    // The same conflict refused: detected equals injected, C is clean.
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop"))
        .fail(Refusal::Conflict);
    let f = check(&h.ops(), &fin);
    assert_eq!((f.counts(), f.conflicts()), ([0; 6], "1/1".to_owned()));
    f.assert_clean("conflict refused", 0);
    // The winning payload called a conflict: detected, never injected.
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v1", Some("shop"))
        .fail(Refusal::Conflict);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [0, 0, 0, 0, 1, 0], "{f}");
    assert_eq!(f.conflicts(), "1/0");
    // One of each: the totals agree (1/1), the answers do not, and C says so.
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop")).ok(true);
    h.invoke(key("shop", "e2"), "v1", None)
        .fail(Refusal::Conflict);
    let f = check(&h.ops(), &fin);
    assert_eq!(
        (f.counts(), f.conflicts()),
        ([0, 0, 0, 0, 2, 0], "1/1".to_owned())
    );
    assert!(!f.clean(0), "{f}");
}

#[test]
fn a_conflict_refused_with_nothing_stored_is_c() {
    let (h, fin) = clean();
    h.invoke(key("shop", "e9"), "v1", Some("shop"))
        .fail(Refusal::Conflict);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [0, 0, 0, 0, 1, 0], "{f}");
    assert_eq!(f.conflicts(), "1/0");
    // A record without an effect (stored stale, say) is something to conflict with.
    let (h, mut fin) = clean();
    fin.records.insert(key("shop", "e9"), vec![Some(0)]);
    h.invoke(key("shop", "e9"), "v2", Some("shop"))
        .fail(Refusal::Conflict);
    assert_eq!(figures(&h, &fin), [0; 6]);
}

#[test]
fn effects_from_another_sources_credentials_are_u() {
    // An effect in source `bank` from a payload only ever sent with shop's secret.
    let (h, mut fin) = clean();
    h.invoke(key("bank", "e1"), "v9", Some("shop"))
        .fail(Refusal::Unauthorized);
    fin.effects.insert(key("bank", "e1"), vec!["v9".into()]);
    fin.records.insert(key("bank", "e1"), vec![None]);
    assert_eq!(figures(&h, &fin), [0, 0, 0, 0, 0, 1]);
    // A payload nobody sent at all, or only with a forged signature, is no better.
    let (h, mut fin) = clean();
    h.invoke(key("shop", "e5"), "v5", Some("forged"))
        .fail(Refusal::Unauthorized);
    fin.effects.insert(key("shop", "e5"), vec!["v5".into()]);
    fin.effects
        .insert(key("shop", "e6"), vec!["never sent".into()]);
    assert_eq!(figures(&h, &fin), [0, 0, 0, 0, 0, 2]);
    // Shop's secret acknowledged on bank's endpoint (it also lacks its effect: L and P).
    let (h, fin) = clean();
    h.invoke(key("bank", "e1"), "v1", Some("shop")).ok(false);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.u.len(), 1, "{f}");
    assert_eq!(f.c.len(), 0, "{f}");
}

#[test]
fn unresolved_keys_and_unfinished_operations_are_counted_apart() {
    let (h, mut fin) = clean();
    fin.unresolved.push(key("shop", "e1"));
    let _never = h.invoke(key("shop", "e9"), "v1", None);
    let f = check(&h.ops(), &fin);
    assert_eq!(f.counts(), [0; 6], "{f}");
    assert_eq!(f.unresolved.len(), 2, "{f}");
    assert!(!f.clean(0));
    f.assert_clean("parks one on purpose", 2);
}

#[test]
#[should_panic(expected = "D=1")]
fn assert_clean_fails_on_any_finding() {
    let (h, mut fin) = clean();
    fin.effects
        .get_mut(&key("shop", "e1"))
        .unwrap()
        .push("v1".into());
    check(&h.ops(), &fin).assert_clean("broken", 0);
}

#[test]
#[should_panic(expected = "C=0/1")]
fn assert_clean_fails_on_a_missed_conflict() {
    let (h, fin) = clean();
    h.invoke(key("shop", "e1"), "v2", Some("shop")).ok(true);
    check(&h.ops(), &fin).assert_clean("missed conflict", 0);
}
