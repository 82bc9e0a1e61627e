//! What the two ledger examples (SQLite's and PostgreSQL's) share: the scenario's summary and
//! how it prints, and the credit a payload asks for. Each example keeps its own store's part.

use std::fmt;

use oncebox_core::json::{self, Pointer, Value};
use oncebox_core::{ProcessError, Processed, Response};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The seed's number of deliveries of one event.
pub const DELIVERIES: usize = 20;

/// What each step of the scenario answered, in order, for the caller to check.
#[derive(Debug)]
pub struct LedgerSummary {
    /// 1. provider-a/evt-1 credits 500.
    pub first: Processed,
    /// 2. The same delivery again.
    pub repeat: Processed,
    /// 3. provider-a/evt-1 again, now asking for 700.
    pub conflict: Result<Processed, ProcessError>,
    pub balance_after_conflict: i64,
    /// 4. provider-a/evt-2 whose handler fails after its credit...
    pub failed: Result<Processed, ProcessError>,
    pub balance_after_failure: i64,
    pub evt2_recorded_after_failure: bool,
    /// ...and the sender's retry of it.
    pub retry: Processed,
    /// 5. The first responses of the concurrent deliveries of provider-a/evt-3, by outcome.
    pub applied: Vec<Response>,
    pub duplicates: Vec<Response>,
    /// 6. The state the seed checks.
    pub balance: i64,
    pub inbox_rows: i64,
    pub credit_rows: i64,
    /// 7. Exercises: the same event id from another source...
    pub other_source: Processed,
    pub balance_with_other_source: i64,
    /// ...a credit to an account that does not exist...
    pub missing_account: Result<Processed, ProcessError>,
    pub inbox_rows_after_missing_account: i64,
    /// ...and a late duplicate of evt-3, which replays its first response, not today's balance.
    pub late_duplicate: Processed,
}

impl LedgerSummary {
    /// The seed's final line: `balance=1500, inbox=3, applied=1, duplicate=19`.
    pub fn seed_holds(&self) -> bool {
        self.balance == 1500
            && self.inbox_rows == 3
            && self.applied.len() == 1
            && self.duplicates.len() == DELIVERIES - 1
    }
}

/// A credit as the handler needs it, validated like the seed's `apply_credit`.
#[derive(Debug, Clone, Copy)]
pub struct Credit {
    pub account: i64,
    pub amount: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum CreditError {
    #[error("payload is not JSON: {0}")]
    Json(#[from] json::JsonError),
    #[error("account_id must be a positive integer")]
    Account,
    /// Bounded so that sums stay far from i64 overflow in this demo; a real ledger also
    /// bounds the balance.
    #[error("amount must be an integer from 1 to 10^9")]
    Amount,
    #[error("account {0} does not exist")]
    NoAccount(i64),
}

impl Credit {
    pub fn parse(payload: &[u8]) -> Result<Credit, CreditError> {
        let value = json::parse(payload)?;
        let int = |name: &str| match value.pointer(&Pointer::from_tokens(vec![name.to_owned()])) {
            Some(Value::Number(n)) => n.to_i64(),
            _ => None,
        };
        let account = int("account_id")
            .filter(|id| *id > 0)
            .ok_or(CreditError::Account)?;
        let amount = int("amount")
            .filter(|a| (1..=1_000_000_000).contains(a))
            .ok_or(CreditError::Amount)?;
        Ok(Credit { account, amount })
    }
}

/// A human line for an outcome: response bodies are JSON text, so show them as such.
pub fn show(outcome: Result<&Processed, &ProcessError>) -> String {
    let body = |r: &Response| String::from_utf8_lossy(&r.body).into_owned();
    match outcome {
        Ok(Processed::Applied(r)) => format!("applied {}", body(r)),
        Ok(Processed::Duplicate(r)) => format!("duplicate {}", body(r)),
        Ok(other) => format!("{other:?}"),
        Err(ProcessError::Conflict { .. }) => "conflict: key reused with another payload".into(),
        Err(e) => format!("error: {e}"),
    }
}

impl fmt::Display for LedgerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.seed_holds() { "OK" } else { "FAILED" };
        let (balance, inbox) = (self.balance, self.inbox_rows);
        let (applied, duplicate) = (self.applied.len(), self.duplicates.len());
        writeln!(
            f,
            "{verdict}: balance={balance}, inbox={inbox}, applied={applied}, duplicate={duplicate}"
        )?;
        let evt3 = self
            .applied
            .first()
            .map(|r| String::from_utf8_lossy(&r.body));
        let lines = [
            ("evt-1 credit 500", show(Ok(&self.first))),
            ("evt-1 again", show(Ok(&self.repeat))),
            ("evt-1 asking 700", show(self.conflict.as_ref())),
            ("evt-2 failing", show(self.failed.as_ref())),
            ("evt-2 retried", show(Ok(&self.retry))),
            (
                "evt-3 first response",
                evt3.unwrap_or_default().into_owned(),
            ),
            ("provider-b/evt-1", show(Ok(&self.other_source))),
            ("account 99", show(self.missing_account.as_ref())),
            ("evt-3 late duplicate", show(Ok(&self.late_duplicate))),
        ];
        for (label, text) in lines {
            writeln!(f, "{label:<22}{text}")?;
        }
        write!(
            f,
            "balance after the conflict {}, after the failure {} (evt-2 recorded: {}), \
             after provider-b {}; credit rows {}; inbox rows after account 99: {}",
            self.balance_after_conflict,
            self.balance_after_failure,
            self.evt2_recorded_after_failure,
            self.balance_with_other_source,
            self.credit_rows,
            self.inbox_rows_after_missing_account
        )
    }
}
