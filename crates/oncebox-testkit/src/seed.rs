//! Seeded randomness for randomized fault tests: the seed is printed before it is used, and
//! `ONCEBOX_SEED=N` replays a run with the same choices.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::SeedableRng;
use rand::rngs::StdRng;

/// The variable that replays a run.
pub const VAR: &str = "ONCEBOX_SEED";

/// One run's seed. Every random choice of a test derives from it, so a failure replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(u64);

impl Seed {
    /// `ONCEBOX_SEED` when set (a number), else a fresh one from the clock. Prints it on stderr
    /// with the command that replays it, labelled `what`, before anything uses it: a run that
    /// hangs or aborts has already said how to repeat it.
    pub fn from_env(what: &str) -> Seed {
        let seed = match std::env::var(VAR) {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{VAR}={v:?} is not an unsigned 64-bit number")),
            Err(_) => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        eprintln!("{what}: seed {seed} (replay with {VAR}={seed})");
        Seed(seed)
    }

    /// A proptest configuration whose cases are drawn from this seed, instead of proptest's own
    /// random seed, which it never prints: `ONCEBOX_SEED` then replays a property test as it
    /// does every other randomized one. No regression files are written; a failure prints its
    /// shrunk case and this seed.
    pub fn proptest(self) -> proptest::test_runner::Config {
        proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(self.0),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        }
    }

    pub fn fixed(seed: u64) -> Seed {
        Seed(seed)
    }

    pub fn value(self) -> u64 {
        self.0
    }

    /// An independent generator for one `stream` of choices (a sender, a killer): streams do
    /// not shift each other's draws when one of them draws more often in a replay.
    pub fn rng(self, stream: u64) -> StdRng {
        // SplitMix64's increment: distinct streams land far apart in the seed space.
        StdRng::seed_from_u64(self.0 ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::Seed;

    #[test]
    fn one_seed_replays_the_same_draws_and_streams_differ() {
        let draws = |stream| {
            let mut rng = Seed::fixed(42).rng(stream);
            (0..8).map(|_| rng.random::<u32>()).collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
    }

    #[test]
    fn one_seed_replays_a_property_tests_cases() {
        use proptest::strategy::{Strategy, ValueTree};
        let cases = |seed| {
            let mut runner = proptest::test_runner::TestRunner::new(Seed::fixed(seed).proptest());
            (0..8)
                .map(|_| (0..u64::MAX).new_tree(&mut runner).unwrap().current())
                .collect::<Vec<_>>()
        };
        assert_eq!(cases(42), cases(42));
        assert_ne!(cases(42), cases(43));
        assert!(Seed::fixed(42).proptest().failure_persistence.is_none());
    }
}
