//! Proof that requests of one key really raced, rather than assumed from a barrier: a run that
//! happened to go one request after another would pass a "one applied, the rest duplicates"
//! check all the same. A loser sent before the winner was answered had to learn of the winner
//! from the store while the winner was still in flight.

use std::future::Future;
use std::time::Instant;

/// One request's answer, with when it was sent and when its answer came.
#[derive(Debug, Clone)]
pub struct Timed<T> {
    pub sent: Instant,
    pub answered: Instant,
    pub value: T,
}

/// Runs `request`, timing it.
pub async fn timed<F: Future>(request: F) -> Timed<F::Output> {
    let sent = Instant::now();
    let value = request.await;
    Timed {
        sent,
        answered: Instant::now(),
        value,
    }
}

/// How many of `answers` for which `won` is false were sent before the one for which it is true
/// was answered, counting only those `rival` accepts as the winner's rivals (another node's, say).
/// `None` when no answer won.
pub fn raced<T>(
    answers: &[Timed<T>],
    won: impl Fn(&T) -> bool,
    rival: impl Fn(&T, &T) -> bool,
) -> Option<usize> {
    let winner = answers.iter().find(|a| won(&a.value))?;
    Some(
        answers
            .iter()
            .filter(|a| !won(&a.value) && rival(&winner.value, &a.value))
            .filter(|a| a.sent < winner.answered)
            .count(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_losers_sent_before_the_winner_answered_count() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let answer = |sent, answered, value| Timed {
            sent: at(sent),
            answered: at(answered),
            value,
        };
        let answers = [
            answer(0, 10, true),
            answer(5, 12, false),
            answer(11, 13, false),
        ];
        assert_eq!(raced(&answers, |w| *w, |_, _| true), Some(1));
        assert_eq!(raced(&answers, |w| *w, |_, _| false), Some(0));
        assert_eq!(raced(&answers[1..], |w| *w, |_, _| true), None);
    }
}
