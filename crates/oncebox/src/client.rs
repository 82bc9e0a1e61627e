//! What `send` and `bench` share as clients of a running gateway: test event bodies that carry
//! the event id where the source's rule reads it.

use anyhow::{Context, Result};
use oncebox_core::fingerprint::derive_event_id;
use oncebox_gateway::policy::EventIdRule;
use serde_json::{Map, Value};

/// Sets `id` in `doc` wherever `rule` reads the event id from the body: at its JSON pointer,
/// or at each field a derived id is computed from (a unique id there makes the derived id
/// unique too). Header rules read no body field, and `doc` is left as it is.
pub fn place_id(rule: &EventIdRule, doc: &mut Value, id: &str) {
    match rule {
        EventIdRule::Pointer(p) => set(doc, p.tokens(), Value::String(id.to_owned())),
        EventIdRule::Derive(pointers) => {
            for p in pointers {
                set(doc, p.tokens(), Value::String(id.to_owned()));
            }
        }
        _ => {}
    }
}

/// The id the gateway stores `body` under when the sender's id is `id`: the derived one for
/// a derived rule, else `id` itself.
pub fn stored_id(rule: &EventIdRule, body: &str, id: &str) -> Result<String> {
    match rule {
        EventIdRule::Derive(pointers) => {
            derive_event_id(body.as_bytes(), pointers).context("deriving the event id")
        }
        _ => Ok(id.to_owned()),
    }
}

/// Sets the value at a JSON pointer, creating objects on the way; the root cannot be set.
fn set(doc: &mut Value, tokens: &[String], value: Value) {
    let Some((last, path)) = tokens.split_last() else {
        return;
    };
    let mut at = doc;
    for token in path {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else { return };
        at = map
            .entry(token.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    if let Value::Object(map) = at {
        map.insert(last.clone(), value);
    }
}
