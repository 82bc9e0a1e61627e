//! The figures of TESTING.md, computed from a [`History`](crate::history::History) of what
//! senders were told and the [`Final`] state read after the drain (faults stopped, senders
//! retried, relays and consumers run until idle). Each figure is a list of findings naming a
//! key, so a failure says which key broke which guarantee.
//!
//! The letters follow TESTING.md's table with two changes, both stricter: TESTING's "U"
//! (effects in source B caused by source A's credentials) and "C" (conflicts detected equal
//! conflicts injected) are both *contamination* here, figure C, which must be zero; and U
//! counts what a run left unresolved, which TESTING.md asks for in prose ("drain before
//! checking") and which only a scenario that parks deliveries on purpose may see non-zero.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::history::{Key, Op, Outcome, Refusal};

/// What the system holds after the drain.
#[derive(Debug, Clone, Default)]
pub struct Final {
    /// Every effect observed, per key, as the payload tag it applied: rows of the test's own
    /// effect table, applications counted by a receiver that does not deduplicate, or — where
    /// the inbox record is the only effect — one entry per inbox row. Two entries for a key is
    /// a double apply.
    pub effects: BTreeMap<Key, Vec<String>>,
    /// Committed inbox records per key, each with its commit stamp in wall-clock ms when the
    /// store keeps one (`None`: committed at an unknown time).
    pub records: BTreeMap<Key, Vec<Option<i64>>>,
    /// Keys neither done nor free after the drain: a delivery `uncertain` or still owed, an
    /// inbox record still `processing` or `uncertain`.
    pub unresolved: Vec<Key>,
}

/// The six figures, each a list of findings; and the counts that say what the run did.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// D: keys whose effect was applied more than once (two effects, or two inbox records).
    pub d: Vec<String>,
    /// L: keys acknowledged (an `ok` answer, replayed or not) with no effect after the drain.
    pub l: Vec<String>,
    /// F: "already processed" answers (`ok` with `replayed`) for a key not committed at that
    /// moment: no record at all, every record stamped after the answer, or no other operation
    /// on the key that could have committed it had been invoked before the answer (a first
    /// delivery answered as a replay).
    pub f: Vec<String>,
    /// P: first-time acknowledgements (`ok`, not replayed) given before the key's own commit
    /// was durable: no committed record after the drain (the commit was lost, say in a crash),
    /// or every record stamped after the answer.
    pub p: Vec<String>,
    /// C: contamination across sources, keys or payloads: an effect whose payload no operation
    /// sent for that key with valid credentials (an effect in source B from A's secret); two
    /// payloads applied under one key; an injected conflict (another payload for a committed
    /// key) acknowledged instead of refused; or a conflict reported for the payload that won.
    /// Zero means conflicts detected equal conflicts injected.
    pub c: Vec<String>,
    /// U: left unresolved: [`Final::unresolved`], and operations that never completed (a
    /// sender that never got an answer and never retried: the run did not drain).
    pub u: Vec<String>,
    /// Operations, and how they ended.
    pub ops: usize,
    pub ok: usize,
    pub replays: usize,
    pub fails: usize,
    pub infos: usize,
    pub conflicts_injected: usize,
    pub conflicts_detected: usize,
}

fn name(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

/// Computes the figures; see each field of [`Figures`] for its exact rule.
pub fn check(history: &[Op], fin: &Final) -> Figures {
    let mut f = Figures {
        ops: history.len(),
        ..Figures::default()
    };
    let mut by_key: BTreeMap<&Key, Vec<&Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(&op.key).or_default().push(op);
        match op.outcome() {
            Some(Outcome::Ok { replayed }) => {
                f.ok += 1;
                f.replays += usize::from(*replayed);
            }
            Some(Outcome::Fail(_)) => f.fails += 1,
            Some(Outcome::Info(_)) => f.infos += 1,
            None => {
                f.u.push(format!("op {} on {} never completed", op.id, name(&op.key)))
            }
        }
    }
    for (k, effects) in &fin.effects {
        if effects.len() > 1 {
            f.d.push(format!("{}: {} effects", name(k), effects.len()));
        }
        let tags: BTreeSet<&String> = effects.iter().collect();
        if tags.len() > 1 {
            f.c.push(format!("{}: payloads {tags:?} all applied", name(k)));
        }
        for tag in tags {
            let legit = by_key.get(k).is_some_and(|ops| {
                ops.iter()
                    .any(|o| &o.payload == tag && o.credentials.as_ref().is_none_or(|c| *c == k.0))
            });
            if !legit {
                f.c.push(format!(
                    "{}: effect of payload {tag} that no sender with this source's \
                     credentials sent",
                    name(k)
                ));
            }
        }
    }
    for (k, records) in &fin.records {
        if records.len() > 1 {
            f.d.push(format!("{}: {} inbox records", name(k), records.len()));
        }
    }
    for k in &fin.unresolved {
        f.u.push(format!("{} unresolved after the drain", name(k)));
    }
    for (k, ops) in &by_key {
        let effects = fin.effects.get(*k).map_or(&[][..], Vec::as_slice);
        let records = fin.records.get(*k).map_or(&[][..], Vec::as_slice);
        if effects.is_empty()
            && ops
                .iter()
                .any(|o| matches!(o.outcome(), Some(Outcome::Ok { .. })))
        {
            f.l.push(format!("{}: acknowledged, no effect", name(k)));
        }
        let winner = effects.first();
        for op in ops {
            let Some((done, outcome)) = &op.completed else {
                continue;
            };
            let committed_by_then = || {
                !records.is_empty()
                    && records
                        .iter()
                        .any(|r| r.is_none_or(|at| at <= done.wall_ms))
            };
            match outcome {
                Outcome::Ok { replayed: true } => {
                    // Someone else must have been able to commit it before this answer.
                    let earlier = ops.iter().any(|q| {
                        q.id != op.id
                            && q.invoked.at < done.at
                            && q.completed
                                .as_ref()
                                .is_none_or(|(end, o)| end.at > done.at || o.may_have_committed())
                    });
                    if !committed_by_then() || !earlier {
                        f.f.push(format!(
                            "{}: op {} answered as a replay at {} ms with records {records:?}{}",
                            name(k),
                            op.id,
                            done.wall_ms,
                            if earlier { "" } else { ", no earlier delivery" }
                        ));
                    }
                }
                Outcome::Ok { replayed: false } if !committed_by_then() => {
                    f.p.push(format!(
                        "{}: op {} acknowledged at {} ms, records {records:?}",
                        name(k),
                        op.id,
                        done.wall_ms
                    ));
                }
                _ => {}
            }
            if op.credentials.as_ref().is_some_and(|c| *c != k.0)
                && matches!(outcome, Outcome::Ok { .. })
            {
                f.c.push(format!(
                    "{}: op {} signed for {:?} was acknowledged",
                    name(k),
                    op.id,
                    op.credentials
                ));
            }
            let Some(winner) = winner else { continue };
            let conflict = matches!(outcome, Outcome::Fail(Refusal::Conflict));
            if &op.payload != winner {
                f.conflicts_injected +=
                    usize::from(conflict || matches!(outcome, Outcome::Ok { .. }));
                if conflict {
                    f.conflicts_detected += 1;
                } else if matches!(outcome, Outcome::Ok { .. }) {
                    f.c.push(format!(
                        "{}: payload {} acknowledged after {winner} won",
                        name(k),
                        op.payload
                    ));
                }
            } else if conflict {
                f.c.push(format!(
                    "{}: the winning payload {winner} was called a conflict",
                    name(k)
                ));
            }
        }
    }
    f
}

impl Figures {
    /// `[D, L, F, P, C, U]`.
    pub fn counts(&self) -> [usize; 6] {
        [&self.d, &self.l, &self.f, &self.p, &self.c, &self.u].map(Vec::len)
    }

    /// Fails the test with the first findings of every non-zero figure, U allowed up to
    /// `expected_u` exactly (a scenario that parks deliveries on purpose says how many).
    pub fn assert_clean(&self, scenario: &str, expected_u: usize) {
        let [d, l, f, p, c, u] = self.counts();
        assert!(
            d + l + f + p + c == 0 && u == expected_u,
            "{scenario}: expected D L F P C = 0 and U = {expected_u}; {self}"
        );
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [d, l, f, p, c, u] = self.counts();
        write!(
            out,
            "D={d} L={l} F={f} P={p} C={c} U={u} (ops {}, ok {}, replays {}, fail {}, info {}, \
             conflicts {}/{})",
            self.ops,
            self.ok,
            self.replays,
            self.fails,
            self.infos,
            self.conflicts_detected,
            self.conflicts_injected
        )?;
        for (letter, list) in ["D", "L", "F", "P", "C", "U"]
            .iter()
            .zip([&self.d, &self.l, &self.f, &self.p, &self.c, &self.u])
        {
            for finding in list.iter().take(5) {
                write!(out, "\n  {letter}: {finding}")?;
            }
        }
        Ok(())
    }
}

/// The checker's self-tests: a clean history is all zero, and each deliberately broken variant
/// is caught by the figure meant for it and no other.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{History, key};

    /// Two keys delivered, the second twice (a retry answered as a replay), with their
    /// effects and records stamped at the time of the commit.
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
    fn cross_source_effect_and_undetected_conflict_are_c() {
        // An effect in source `bank` from a payload only ever sent with shop's secret.
        let (h, mut fin) = clean();
        h.invoke(key("bank", "e1"), "v9", Some("shop"))
            .fail(Refusal::Unauthorized);
        fin.effects.insert(key("bank", "e1"), vec!["v9".into()]);
        fin.records.insert(key("bank", "e1"), vec![None]);
        assert_eq!(figures(&h, &fin), [0, 0, 0, 0, 1, 0]);
        // Shop's secret acknowledged on bank's endpoint.
        let (h, fin) = clean();
        h.invoke(key("bank", "e1"), "v1", Some("shop")).ok(false);
        let f = check(&h.ops(), &fin);
        assert_eq!(f.c.len(), 1, "{f}");
        // Another payload for a committed key acknowledged: an injected conflict missed.
        let (h, fin) = clean();
        h.invoke(key("shop", "e1"), "v2", Some("shop")).ok(true);
        let f = check(&h.ops(), &fin);
        assert_eq!(
            (f.c.len(), f.conflicts_injected, f.conflicts_detected),
            (1, 1, 0)
        );
        // The same conflict refused: detected equals injected, C is zero.
        let (h, fin) = clean();
        h.invoke(key("shop", "e1"), "v2", Some("shop"))
            .fail(Refusal::Conflict);
        let f = check(&h.ops(), &fin);
        assert_eq!(
            (f.counts(), f.conflicts_injected, f.conflicts_detected),
            ([0; 6], 1, 1)
        );
        // The winning payload called a conflict.
        let (h, fin) = clean();
        h.invoke(key("shop", "e1"), "v1", Some("shop"))
            .fail(Refusal::Conflict);
        assert_eq!(figures(&h, &fin), [0, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn unresolved_keys_and_unfinished_operations_are_u() {
        let (h, mut fin) = clean();
        fin.unresolved.push(key("shop", "e1"));
        let _never = h.invoke(key("shop", "e9"), "v1", None);
        let f = check(&h.ops(), &fin);
        assert_eq!(f.counts(), [0, 0, 0, 0, 0, 2], "{f}");
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
}
