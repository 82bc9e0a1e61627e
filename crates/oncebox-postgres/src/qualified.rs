//! The statements oncebox runs inside a handler's transaction, each naming its schema. A
//! handler may change `search_path` (`SET LOCAL search_path TO tenant_1`, as schema-per-tenant
//! applications do), and PostgreSQL resolves an unqualified name, even in a statement prepared
//! earlier, by the path in force when it runs: unqualified, the record's finish, action keys,
//! versions, offsets and outbox rows went to whatever schema the handler's path named first,
//! another deployment's tables among them (its uncertain record marked completed).

use std::sync::Arc;

use crate::inbox::quoted;

/// The schema's statements, built once when the inbox opens.
#[derive(Debug)]
pub(crate) struct InTx {
    /// The channel this schema's relays listen on.
    pub channel: Arc<str>,
    /// The session's own `search_path`, as the connection started with it: a handler's that
    /// differs from it when the record is finished is reset, with a handler's
    /// `synchronous_commit` (see [`crate::claim::finish`]).
    pub path: String,
    pub finish: String,
    pub once: String,
    pub advance: String,
    pub version: String,
    pub enqueue: String,
    pub enqueued: String,
    /// A finished delivery an earlier build's purge left under a key accepted anew.
    pub clear_left_behind: String,
    pub watermark: String,
}

impl InTx {
    /// The statements on the tables in `schema` (as `current_schema()` names it).
    pub(crate) fn new(schema: &str, path: String) -> InTx {
        let s = quoted(schema);
        InTx {
            channel: Arc::from(crate::outbox_channel(schema)),
            path,
            finish: format!(
                "UPDATE {s}.oncebox_inbox SET state = $2, response = $3, completed_at = $4,
                   lease_token = NULL, lease_expires_at = NULL
                 WHERE id = $1 AND txid_current() = $5
                 RETURNING current_setting('search_path') = $6
                   AND current_setting('synchronous_commit') = 'on'"
            ),
            once: format!(
                "INSERT INTO {s}.oncebox_actions (scope, key, source, event_id, at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, key) DO NOTHING"
            ),
            advance: format!(
                "INSERT INTO {s}.oncebox_versions AS v (entity, entity_id, version, source,
                   event_id)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (entity, entity_id) DO UPDATE SET version = excluded.version,
                   source = excluded.source, event_id = excluded.event_id
                 WHERE v.version < excluded.version"
            ),
            version: format!(
                "SELECT version FROM {s}.oncebox_versions WHERE entity = $1 AND entity_id = $2"
            ),
            enqueue: format!(
                "INSERT INTO {s}.oncebox_outbox (destination, idempotency_key, payload,
                   content_type, source, event_id, created_at, next_attempt_at, hops)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)
                 ON CONFLICT (destination, idempotency_key) DO NOTHING"
            ),
            enqueued: format!(
                "SELECT payload, content_type FROM {s}.oncebox_outbox
                 WHERE destination = $1 AND idempotency_key = $2"
            ),
            clear_left_behind: format!(
                "DELETE FROM {s}.oncebox_outbox WHERE destination = $1 AND idempotency_key = $2
                   AND source = $3 AND event_id = $4 AND state IN ('delivered', 'dead')"
            ),
            watermark: format!(
                "INSERT INTO {s}.oncebox_offsets AS o (stream, partition, position)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (stream, partition) DO UPDATE SET position = excluded.position
                 WHERE excluded.position > o.position"
            ),
        }
    }
}
