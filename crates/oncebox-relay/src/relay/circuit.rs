//! A route's circuit: consecutive failed attempts open it and keep claims off the route for a
//! cooldown, then one trial request decides whether it closes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use oncebox_core::relay_store::DeliveryStore;

use super::Relay;

#[derive(Debug, Default)]
pub(super) struct Circuit {
    failures: u32,
    /// On the clock's monotonic time: a wall clock stepped back would keep the route shut
    /// for the step on top of the cooldown.
    open_until: Option<Duration>,
    /// After the cooldown one request tries the receiver; until it is answered the route
    /// stays shut. A whole round (the route's concurrency) sent as the trial was as many
    /// deliveries sent into a receiver still failing: a receiver answering 401 after a key
    /// rotation killed that many per cooldown.
    trial: bool,
    /// How many times the circuit has opened. An attempt's answer counts only in the epoch it
    /// was sent in: a request in flight when the circuit opened that then succeeded closed it
    /// at once, the cooldown skipped and a whole round sent into a receiver still failing; and
    /// a trial's guard dropped late (its record retried for most of a lease) ended a newer
    /// trial, letting a second one out beside it.
    epoch: u64,
}

impl Circuit {
    /// Whether it keeps claims off its route at `now`: open, or its trial out.
    fn shut(&self, now: Duration) -> bool {
        self.trial || self.open_until.is_some_and(|until| until > now)
    }
}

/// What a claim about to be sent finds its route's circuit at.
pub(crate) enum Turn<'a> {
    /// Closed: send, in the circuit's epoch.
    Go { epoch: u64 },
    /// The trial after a cooldown: send, and the route stays shut until it is answered.
    Trial { epoch: u64, _ends: TrialGuard<'a> },
    /// Open, or a trial already out: give the claim back unsent.
    Shut,
}

impl Turn<'_> {
    /// The epoch a request sent on this turn goes out in; `None`: not to be sent.
    pub(crate) fn epoch(&self) -> Option<u64> {
        match self {
            Turn::Go { epoch } | Turn::Trial { epoch, .. } => Some(*epoch),
            Turn::Shut => None,
        }
    }
}

/// Ends a trial that was never answered (the request was not sent, the step failed): the
/// route is tried again at the next round. An answered trial was settled by `note` already.
pub(crate) struct TrialGuard<'a> {
    circuits: &'a Mutex<HashMap<String, Circuit>>,
    route: String,
    epoch: u64,
}

impl Drop for TrialGuard<'_> {
    fn drop(&mut self) {
        let mut circuits = super::lock(self.circuits);
        // A trial of a later epoch is another's: this one's was settled before it began.
        if let Some(c) = circuits
            .get_mut(&self.route)
            .filter(|c| c.epoch == self.epoch)
        {
            c.trial = false;
        }
    }
}

impl<S: DeliveryStore> Relay<S> {
    pub(super) fn circuits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Circuit>> {
        super::lock(&self.circuits)
    }

    /// Whether a claim of `route` about to be sent may go: the circuit closed, the one trial
    /// after a cooldown, or neither.
    pub(super) fn turn(&self, route: &str) -> Turn<'_> {
        let now = self.clock.monotonic();
        let mut circuits = self.circuits();
        // A route that never failed has no entry: nothing to allocate on every send.
        let Some(c) = circuits.get_mut(route) else {
            return Turn::Go { epoch: 0 };
        };
        if c.shut(now) {
            return Turn::Shut;
        }
        let epoch = c.epoch;
        // Never opened since its last success (failures below the threshold, none asking for
        // a pause): no trial needed.
        if c.open_until.is_none() {
            return Turn::Go { epoch };
        }
        c.trial = true;
        Turn::Trial {
            epoch,
            _ends: TrialGuard {
                circuits: &self.circuits,
                route: route.to_owned(),
                epoch,
            },
        }
    }

    /// Tells `route`'s circuit how an attempt sent in `epoch` ([`Turn::epoch`]) went. One sent
    /// before the circuit last opened says nothing of the receiver since: it is left out. A
    /// failure whose answer asked the client to wait (`pause`, `deliver.rs`) opens the circuit
    /// at once, for that long, or the cooldown if the failures reached the threshold and it is
    /// longer; then a trial decides, as after any cooldown.
    pub(super) fn note(&self, route: &str, failed: bool, epoch: u64, pause: Option<Duration>) {
        let mut circuits = self.circuits();
        let c = circuits.entry(route.to_owned()).or_default();
        let now = self.clock.monotonic();
        if c.epoch != epoch {
            // Says nothing of the receiver since the circuit opened, but a request for quiet
            // still holds: the route waits at least that long.
            if let (true, Some(asked)) = (failed, pause) {
                let until = now.saturating_add(asked);
                c.open_until = Some(c.open_until.map_or(until, |u| u.max(until)));
            }
            return;
        }
        if failed {
            c.trial = false;
            c.failures = c.failures.saturating_add(1);
            // A failed trial (after a pause too, whatever the count) opens it again.
            let tripped = c.failures >= self.options.circuit_threshold || c.open_until.is_some();
            if tripped || pause.is_some() {
                c.epoch = c.epoch.wrapping_add(1);
                // Stop hammering a receiver that keeps failing, or asked for quiet; its
                // deliveries wait, unharmed.
                let cooldown = match pause {
                    Some(asked) if tripped => asked.max(self.options.circuit_cooldown),
                    Some(asked) => asked,
                    None => self.options.circuit_cooldown,
                };
                c.open_until = Some(now.saturating_add(cooldown));
                tracing::warn!(route, failures = c.failures, ?cooldown, "circuit open");
            }
        } else {
            *c = Circuit {
                epoch: c.epoch,
                ..Circuit::default()
            };
        }
    }
}

/// Whether `route`'s circuit keeps claims off it at `now`: open, or its trial out.
pub(super) fn open(circuits: &HashMap<String, Circuit>, route: &str, now: Duration) -> bool {
    circuits.get(route).is_some_and(|c| c.shut(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trial's guard dropped after the circuit opened again and let a newer trial out (its
    /// record retried for most of a lease meanwhile) leaves that trial out: ending it let a
    /// second trial out beside it. A guard of the epoch still current ends its own trial.
    #[test]
    fn a_trial_guard_ends_only_its_own_epochs_trial() {
        let circuits = Mutex::new(HashMap::new());
        let guard = |epoch| TrialGuard {
            circuits: &circuits,
            route: "r".to_owned(),
            epoch,
        };
        let trial_out = |epoch| {
            let mut all = super::super::lock(&circuits);
            all.insert(
                "r".to_owned(),
                Circuit {
                    failures: 3,
                    open_until: None,
                    trial: true,
                    epoch,
                },
            );
        };
        let late = guard(1);
        trial_out(2);
        drop(late);
        assert!(
            super::super::lock(&circuits)["r"].trial,
            "the newer trial is still out"
        );
        let own = guard(2);
        drop(own);
        assert!(
            !super::super::lock(&circuits)["r"].trial,
            "its own guard ended it"
        );
        // A route with no circuit (never failed) is left without one.
        drop(TrialGuard {
            circuits: &circuits,
            route: "other".to_owned(),
            epoch: 0,
        });
        assert!(!super::super::lock(&circuits).contains_key("other"));
    }
}
