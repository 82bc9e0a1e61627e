//! The offset watermark outside a handler: where a consumer of an ordered log resumes, and a
//! move of its own for a message acknowledged without being applied.

use oncebox_core::OffsetMove;

use crate::Inbox;
use crate::silent::answered;

impl Inbox {
    /// The highest offset applied (or passed over) on `(stream, partition)`: a consumer that
    /// keeps its position here (a Kafka partition's, say) seeks to the next one after a
    /// restart, so the log's own committed offset need not agree. `None` before the first.
    pub async fn offset(&self, stream: &str, partition: i64) -> Result<Option<i64>, crate::Error> {
        let position = sqlx::query_scalar(
            "SELECT position FROM oncebox_offsets WHERE stream = $1 AND partition = $2",
        )
        .bind(stream)
        .bind(partition)
        .fetch_optional(self.pool());
        Ok(answered(self.lost_after, position).await?)
    }

    /// Moves the watermark of `(stream, partition)` up to `offset` in a transaction of its own:
    /// for a message the consumer acknowledges without applying it (its handler refused it, or
    /// the inbox answered it as a duplicate, whose handler never ran and so never moved it).
    /// Left behind, a replay of the log's tail after the records were purged would apply it.
    /// `Replay` when the watermark already stood at or above it.
    pub async fn move_offset(
        &self,
        stream: &str,
        partition: i64,
        offset: i64,
    ) -> Result<OffsetMove, crate::Error> {
        // The statement a handler's `commit_offset` runs, on a connection of its own.
        let moved = sqlx::query(&self.in_tx.watermark)
            .bind(stream)
            .bind(partition)
            .bind(offset)
            .execute(self.pool());
        // Past the bound it may have moved: a move repeated after it reads `Replay`.
        let moved = answered(self.lost_after, moved).await?.rows_affected();
        Ok(if moved == 1 {
            OffsetMove::Advanced
        } else {
            OffsetMove::Replay
        })
    }
}
