//! The conflict half of the crash and kill scenarios: a delivery refused `422 key-reused` was
//! refused because another payload came first, and that refusal is kept for audit (a row in
//! `oncebox_conflicts` with the payload offered) in the same transaction as the answer. A crash
//! must not leave a refusal answered with no row to show for it.

use std::collections::BTreeMap;

use oncebox_testkit::checker::Figures;
use oncebox_testkit::history::{Key, Op, Outcome, Refusal};

/// Adds a C finding to `figures` for each key refused as a conflict more often, with a payload
/// tag, than `recorded` (the conflicts kept, as key and offered payload's tag) holds rows for
/// it. Rows without a refusal are fine: a refusal whose answer was lost to a crash was still
/// recorded. Returns how many such rows there were: refusals committed but never answered.
pub fn check(figures: &mut Figures, ops: &[Op], recorded: Vec<(Key, String)>) -> usize {
    let mut refused: BTreeMap<(&Key, &str), usize> = BTreeMap::new();
    for op in ops {
        if matches!(op.outcome(), Some(Outcome::Fail(Refusal::Conflict))) {
            *refused.entry((&op.key, op.payload.as_str())).or_default() += 1;
        }
    }
    let mut kept: BTreeMap<(Key, String), usize> = BTreeMap::new();
    for row in recorded {
        *kept.entry(row).or_default() += 1;
    }
    let mut surplus = 0;
    for ((k, tag), n) in refused {
        let rows = kept.remove(&(k.clone(), tag.to_owned())).unwrap_or(0);
        surplus += rows.saturating_sub(n);
        if rows < n {
            figures.c.push(format!(
                "{}/{}: refused {n} times as a conflict with payload {tag}, {rows} recorded",
                k.0, k.1
            ));
        }
    }
    // What `remove` left: rows of keys never refused at all, each a refusal never answered.
    surplus + kept.values().sum::<usize>()
}
