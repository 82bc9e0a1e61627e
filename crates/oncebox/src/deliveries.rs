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
use crate::store::Store;

/// One delivery of `deliveries list --output json`; field names are a contract (DESIGN §7
/// names the first six).
#[derive(Serialize)]
struct DeliveryItem<'a> {
    id: i64,
    route: &'a str,
    source: &'a str,
    event_id: &'a str,
    state: &'a str,
    attempts: u32,
    created_at: String,
    next_attempt_at: Option<String>,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    note: Option<&'a str>,
}

fn item(d: &DeliveryView) -> DeliveryItem<'_> {
    DeliveryItem {
        id: d.id,
        route: &d.route,
        source: d.key.source.as_str(),
        event_id: d.key.event_id.as_str(),
        state: d.state.as_str(),
        attempts: d.attempts,
        created_at: rfc3339(d.created_at),
        next_attempt_at: d.next_attempt_at.map(rfc3339),
        last_status: d.last_status,
        last_error: d.last_error.as_deref(),
        note: d.note.as_deref(),
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
                            d.last_error.as_deref().unwrap_or("")
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
                "not resolvable (only pending, retrying, uncertain or dead)",
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
