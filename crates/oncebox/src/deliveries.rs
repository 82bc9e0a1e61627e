//! `oncebox deliveries …`: list deliveries and settle them by hand, straight on the database.

use std::io::Write;

use crate::store::Store;
use anyhow::{Result, bail};
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, Resolve};
use oncebox_core::{Clock, SystemClock};

use crate::DeliveriesCommand;

/// Returns `Ok(false)` (exit code 3) when an action was refused by the delivery's state.
pub async fn run(out: &mut impl Write, inbox: &Store, action: DeliveriesCommand) -> Result<bool> {
    match action {
        DeliveriesCommand::List {
            state,
            route,
            after,
            limit,
            output,
        } => {
            let state = match state.as_deref() {
                None => None,
                Some(s) => match DeliveryState::parse(s) {
                    Some(s) => Some(s),
                    None => bail!(
                        "unknown state {s:?}: pending, in_flight, delivered, retrying, uncertain or dead"
                    ),
                },
            };
            let filter = DeliveryFilter {
                state,
                route,
                key: None,
                after,
                limit,
            };
            let page = inbox.deliveries(filter).await?;
            if output == "json" {
                let items: Vec<_> = page
                    .items
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "id": d.id, "route": d.route, "source": d.key.source.as_str(),
                            "event_id": d.key.event_id.as_str(), "state": d.state.as_str(),
                            "attempts": d.attempts, "last_status": d.last_status, "last_error": d.last_error,
                        })
                    })
                    .collect();
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({ "items": items, "next": page.next.map(|n| n.to_string()) })
                )?;
            } else {
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
            Ok(true)
        }
        DeliveriesCommand::Retry { id } => {
            let ok = inbox.retry(id, SystemClock.now()).await?;
            writeln!(
                out,
                "{}",
                if ok {
                    "due now"
                } else {
                    "not retryable (only dead, uncertain or retrying)"
                }
            )?;
            Ok(ok)
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
            let ok =
                DeliveryStore::resolve(inbox, id, resolution, &note, SystemClock.now()).await?;
            writeln!(
                out,
                "{}",
                if ok {
                    "resolved"
                } else {
                    "not resolvable (only uncertain, dead or retrying)"
                }
            )?;
            Ok(ok)
        }
    }
}
