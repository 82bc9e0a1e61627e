//! The figures of TESTING.md, computed from a [`History`](crate::history::History) of what
//! senders were told and the [`Final`] state read after the drain (faults stopped, senders
//! retried, relays and consumers run until idle). Each figure is a list of findings naming a
//! key, so a failure says which key broke which guarantee.
//!
//! The six letters mean what TESTING.md's table says: D applied more than once, L acknowledged
//! and lost, F a duplicate answer for an uncommitted key, P a 2xx before our commit was
//! durable, C conflicts detected against conflicts injected (shown `detected/injected`, equal
//! when clean), U effects in a source caused by another source's credentials. One more count
//! sits beside them under its own name, *unresolved*: what the run left neither done nor free,
//! which TESTING.md asks for in prose ("drain before checking") and which only a scenario that
//! parks deliveries on purpose may see non-zero, as many as it parked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::history::{Key, Op, Outcome, Refusal};

#[cfg(test)]
mod tests;

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

/// The six figures, each a list of findings; the unresolved count; and the counts that say
/// what the run did.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// D: keys whose effect was applied more than once (two effects, two inbox records, or
    /// two answers as new for one record).
    /// Two *different* payloads applied under one key are found here too, in the same finding
    /// as the key's effect count: that is D's definition word for word (the key's effect ran
    /// twice), and D is raised by the count whatever the payloads. That the second payload
    /// should have been refused as a conflict is C's concern only where a sender was answered
    /// (C counts answers: an acknowledged second payload is injected and not detected);
    /// counting the applied payload in C as well would count one conflicting delivery twice.
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
    /// C: one finding for each answer where conflicts detected and conflicts injected part
    /// ([`Figures::conflicts_injected`], [`Figures::conflicts_detected`]): another payload
    /// for a key acknowledged instead of refused (injected, not detected), or the winning
    /// payload refused as a conflict (detected, not injected). Empty means detected equals
    /// injected, answer by answer, not merely in total.
    pub c: Vec<String>,
    /// U: effects in a source that its own credentials did not cause: an effect whose payload
    /// no operation sent for that key with the source's credentials (or with none, where the
    /// source takes unsigned requests), so one that only another source's secret, a forged
    /// signature or nobody sent; and an acknowledgement of a request signed with credentials
    /// other than the key's source's (an acknowledgement is the gateway's word that the
    /// request's effect is there, which L holds it to). Stricter than TESTING.md's "source A's
    /// credentials": any credentials but the source's own count.
    pub u: Vec<String>,
    /// Not one of TESTING.md's figures: left unresolved, [`Final::unresolved`], and operations
    /// that never completed (a sender that never got an answer and never retried: the run did
    /// not drain). Must equal what the scenario parks on purpose, usually zero.
    pub unresolved: Vec<String>,
    /// Operations, and how they ended.
    pub ops: usize,
    pub ok: usize,
    pub replays: usize,
    pub fails: usize,
    pub infos: usize,
    /// Conflicts injected: answered operations (acknowledged, or refused as a conflict) that
    /// carried another payload than the one that won their key. Operations with no definite
    /// answer are not counted: nobody can say what the system decided for them.
    pub conflicts_injected: usize,
    /// Conflicts detected: conflict refusals (422 `key-reused`, `Conflict`) on a key with a
    /// winner, whichever payload they carried.
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
            None => f
                .unresolved
                .push(format!("op {} on {} never completed", op.id, name(&op.key))),
        }
    }
    for (k, effects) in &fin.effects {
        let tags: BTreeSet<&String> = effects.iter().collect();
        if effects.len() > 1 {
            let payloads = if tags.len() > 1 {
                format!(" of payloads {tags:?}: another payload applied under the key")
            } else {
                String::new()
            };
            f.d.push(format!("{}: {} effects{payloads}", name(k), effects.len()));
        }
        for tag in tags {
            let own = by_key.get(k).is_some_and(|ops| {
                ops.iter()
                    .any(|o| &o.payload == tag && o.credentials.as_ref().is_none_or(|c| *c == k.0))
            });
            if !own {
                f.u.push(format!(
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
        f.unresolved
            .push(format!("{} unresolved after the drain", name(k)));
    }
    for (k, ops) in &by_key {
        let effects = fin.effects.get(*k).map_or(&[][..], Vec::as_slice);
        let records = fin.records.get(*k).map_or(&[][..], Vec::as_slice);
        let p_before = f.p.len();
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
                f.u.push(format!(
                    "{}: op {} signed for {:?} was acknowledged",
                    name(k),
                    op.id,
                    op.credentials
                ));
            }
            let refused = matches!(outcome, Outcome::Fail(Refusal::Conflict));
            let Some(winner) = winner else {
                // A conflict needs a stored first payload: with no record of the key at all
                // after the drain, the refusal was false (detected, never injected).
                if refused && records.is_empty() {
                    f.conflicts_detected += 1;
                    f.c.push(format!(
                        "{}: op {} refused as a conflict with nothing stored under the key",
                        name(k),
                        op.id
                    ));
                }
                continue;
            };
            let acknowledged = matches!(outcome, Outcome::Ok { .. });
            let injected = &op.payload != winner && (refused || acknowledged);
            f.conflicts_injected += usize::from(injected);
            f.conflicts_detected += usize::from(refused);
            // Every answer moves both counts alike or leaves a finding: so C empty means the
            // two are equal, and equal totals cannot hide a missed conflict behind a false one.
            match (injected, refused) {
                (true, false) => f.c.push(format!(
                    "{}: payload {} acknowledged after {winner} won: injected, not detected",
                    name(k),
                    op.payload
                )),
                (false, true) => f.c.push(format!(
                    "{}: op {} with the winning payload {winner} refused as a conflict: \
                     detected, not injected",
                    name(k),
                    op.id
                )),
                _ => {}
            }
        }
        // A key's first answer is given once: a second answer as new means it was applied
        // again, which a store keeping one record per key cannot show afterwards (the second
        // overwrote the first). Not where its effects or records say so already, where nothing
        // was stored (L), or where an answer came before its commit (P: that commit may have
        // been lost, and the retry's the only one).
        let fresh = ops
            .iter()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { replayed: false })))
            .count();
        let stored_once = effects.len() == 1 || (effects.is_empty() && records.len() == 1);
        if fresh > 1 && stored_once && records.len() <= 1 && f.p.len() == p_before {
            f.d.push(format!(
                "{}: answered as new {fresh} times, so applied {fresh} times (one record \
                 either way)",
                name(k)
            ));
        }
    }
    f
}

impl Figures {
    /// `[D, L, F, P, C, U]`: the number of findings of each figure (C: the answers where
    /// detected and injected part).
    pub fn counts(&self) -> [usize; 6] {
        [&self.d, &self.l, &self.f, &self.p, &self.c, &self.u].map(Vec::len)
    }

    /// C as TESTING.md shows it: `detected/injected`.
    pub fn conflicts(&self) -> String {
        format!("{}/{}", self.conflicts_detected, self.conflicts_injected)
    }

    /// Whether the run is clean: no finding in any figure (so C's detected equals injected)
    /// and exactly `expected_unresolved` left unresolved (what the scenario parks on purpose).
    pub fn clean(&self, expected_unresolved: usize) -> bool {
        self.counts() == [0; 6]
            && self.conflicts_detected == self.conflicts_injected
            && self.unresolved.len() == expected_unresolved
    }

    /// Fails the test with the first findings of every non-zero figure unless [`clean`].
    ///
    /// [`clean`]: Figures::clean
    pub fn assert_clean(&self, scenario: &str, expected_unresolved: usize) {
        assert!(
            self.clean(expected_unresolved),
            "{scenario}: expected D L F P U = 0, C detected = injected and \
             {expected_unresolved} unresolved; {self}"
        );
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [d, l, f, p, _, u] = self.counts();
        write!(
            out,
            "D={d} L={l} F={f} P={p} C={} U={u} unresolved={} (ops {}, ok {}, replays {}, \
             fail {}, info {})",
            self.conflicts(),
            self.unresolved.len(),
            self.ops,
            self.ok,
            self.replays,
            self.fails,
            self.infos,
        )?;
        for (letter, list) in ["D", "L", "F", "P", "C", "U", "unresolved"].iter().zip([
            &self.d,
            &self.l,
            &self.f,
            &self.p,
            &self.c,
            &self.u,
            &self.unresolved,
        ]) {
            for finding in list.iter().take(5) {
                write!(out, "\n  {letter}: {finding}")?;
            }
        }
        Ok(())
    }
}
