//! `oncebox deliveries …`: list deliveries and settle them by hand, straight on the database.

use std::io::Write;

use anyhow::Result;
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, DeliveryView, Resolve};
use oncebox_core::{Clock, SystemClock};
use oncebox_gateway::rfc3339;
use serde::Serialize;

use crate::cli::{DeliveriesCommand, Output};
use crate::events::Listing;
use crate::exit;
use crate::out::one_line;
use crate::store::Store;

/// One delivery of `deliveries list --output json`; field names are a contract (DESIGN §7
/// names the first six).
#[derive(Serialize)]
struct DeliveryItem<'a> {
    id: i64,
    route: &'a str,
    source: &'a str,
    event_id: &'a str,
    /// The key the receiver is sent, as the admin API lists it.
    idempotency_key: &'a str,
    state: &'a str,
    attempts: u32,
    created_at: String,
    next_attempt_at: Option<String>,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    note: Option<&'a str>,
    hops: u32,
}

fn item(d: &DeliveryView) -> DeliveryItem<'_> {
    DeliveryItem {
        id: d.id,
        route: &d.route,
        source: d.key.source.as_str(),
        event_id: d.key.event_id.as_str(),
        idempotency_key: &d.idempotency_key,
        state: d.state.as_str(),
        attempts: d.attempts,
        created_at: rfc3339(d.created_at),
        next_attempt_at: d.next_attempt_at.map(rfc3339),
        last_status: d.last_status,
        last_error: d.last_error.as_deref(),
        note: d.note.as_deref(),
        hops: d.hops,
    }
}

pub async fn run(out: &mut impl Write, store: &Store, action: DeliveriesCommand) -> Result<()> {
    match action {
        DeliveriesCommand::List {
            state,
            route,
            after,
            limit,
            output,
        } => {
            // clap allows only the names `DeliveryState::parse` knows.
            let state = state.as_deref().and_then(DeliveryState::parse);
            let filter = DeliveryFilter {
                state,
                route,
                key: None,
                after,
                due_by: None,
                limit,
            };
            let page = store.deliveries(filter).await?;
            match output.output {
                Output::Json => {
                    let listing = Listing {
                        items: page.items.iter().map(item).collect(),
                        next: page.next.map(|n| n.to_string()),
                    };
                    writeln!(out, "{}", serde_json::to_string(&listing)?)?;
                }
                Output::Text => {
                    for d in &page.items {
                        writeln!(
                            out,
                            "{:>8}  {:<10} {:<12} {:>3} attempts  {}  {}",
                            d.id,
                            d.state,
                            d.route,
                            d.attempts,
                            d.key,
                            reason(d)
                        )?;
                    }
                    if let Some(next) = page.next {
                        writeln!(out, "more: --after {next}")?;
                    }
                }
            }
            Ok(())
        }
        DeliveriesCommand::Retry { id } => {
            if store.retry(id, SystemClock.now()).await? {
                writeln!(out, "due now")?;
                return Ok(());
            }
            Err(refusal(
                store,
                id,
                "not retryable (only dead, uncertain or retrying)",
            )
            .await)
        }
        DeliveriesCommand::Resolve {
            id,
            delivered,
            dead: _,
            note,
        } => {
            let resolution = if delivered {
                Resolve::Delivered
            } else {
                Resolve::Dead
            };
            if DeliveryStore::resolve(store, id, resolution, &note, SystemClock.now()).await? {
                writeln!(out, "resolved")?;
                return Ok(());
            }
            Err(refusal(
                store,
                id,
                "not resolvable (only pending, retrying, uncertain or dead, or in flight past its relay's lease)",
            )
            .await)
        }
    }
}

/// Why an action on delivery `id` changed nothing: it does not exist (not found) or its state
/// refuses the action (refused). The stores answer `false` for both.
async fn refusal(store: &Store, id: i64, refused: &str) -> anyhow::Error {
    match oncebox_core::relay_store::delivery(store, id).await {
        Ok(Some(d)) => exit::refused(format!("delivery {id} is {}: {refused}", d.state)),
        Ok(None) => exit::not_found(format!("no delivery {id}")),
        Err(e) => anyhow::Error::new(e).context(format!("delivery {id}: {refused}")),
    }
}

/// The last column of a listed delivery: an operator's note where one settled it (it says why
/// more than the attempt before), else what its last attempt met, marked as such (a delivery
/// retried by hand is `pending` beside its old failure).
fn reason(d: &DeliveryView) -> String {
    match (&d.note, d.last_status, &d.last_error) {
        (Some(note), ..) if !note.is_empty() => format!("note: {}", one_line(note)),
        (_, _, Some(error)) => format!("last: {}", one_line(error)),
        (_, Some(status), None) => format!("last: answered {status}"),
        (_, None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::delivery::DeliveryState;
    use oncebox_core::relay_store::{Budget, DeliveryView};
    use oncebox_core::{Key, Timestamp};

    fn view(status: Option<u16>, error: Option<&str>, note: Option<&str>) -> DeliveryView {
        DeliveryView {
            id: 1,
            route: "hooks".into(),
            key: Key::parse("shop", "evt_1").unwrap(),
            idempotency_key: "shop:evt_1".into(),
            state: DeliveryState::Uncertain,
            attempts: 1,
            created_at: Timestamp(0),
            budget: Budget {
                attempts_before: 0,
                since: Timestamp(0),
            },
            next_attempt_at: None,
            last_status: status,
            last_error: error.map(str::to_owned),
            note: note.map(str::to_owned),
            hops: 1,
        }
    }

    /// A `302` parked uncertain showed nothing; a dead delivery resolved as delivered still
    /// showed its receiver's `404`.
    #[test]
    fn the_listing_says_what_the_last_attempt_met_or_the_operators_note() {
        let reason = |s, e, n| super::reason(&view(s, e, n));
        assert_eq!(reason(Some(302), None, None), "last: answered 302");
        assert_eq!(
            reason(
                Some(404),
                Some("receiver answered 404"),
                Some("applied by hand")
            ),
            "note: applied by hand"
        );
        assert_eq!(
            reason(None, Some("connection refused"), None),
            "last: connection refused"
        );
        assert_eq!(
            reason(Some(500), Some("receiver answered 500"), Some("")),
            "last: receiver answered 500"
        );
        assert_eq!(reason(None, None, None), "");
        // A note with a line break stays on its row: it cannot fake the paging line.
        assert_eq!(
            reason(None, None, Some("x\nmore: --after 999999")),
            "note: x\\nmore: --after 999999"
        );
    }
}
