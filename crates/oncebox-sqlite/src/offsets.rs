//! The offset watermark outside a handler: where a consumer of an ordered log resumes, and a
//! move of its own for a message acknowledged without being applied.

use oncebox_core::OffsetMove;
use rusqlite::{OptionalExtension, params};

use crate::{Error, Inbox};

impl Inbox {
    /// The highest offset applied (or passed over) on `(stream, partition)`: a consumer that
    /// keeps its position here (a Kafka partition's, say) seeks to the next one after a
    /// restart, so the log's own committed offset need not agree. `None` before the first.
    pub async fn offset(&self, stream: &str, partition: i64) -> Result<Option<i64>, Error> {
        let stream = stream.to_owned();
        self.read(move |c| {
            c.prepare_cached(
                "SELECT position FROM oncebox_offsets WHERE stream = ?1 AND partition = ?2",
            )?
            .query_row(params![stream, partition], |r| r.get(0))
            .optional()
        })
        .await
    }

    /// Moves the watermark of `(stream, partition)` up to `offset` in a transaction of its own:
    /// for a message the consumer acknowledges without applying it (its handler refused it, or
    /// the inbox answered it as a duplicate, whose handler never ran and so never moved it).
    /// Left behind, a replay of the log's tail after the records were purged would apply it.
    /// `Replay` when the watermark already stood at or above it. A stream name holding a NUL
    /// is refused, as inside a handler.
    pub async fn move_offset(
        &self,
        stream: &str,
        partition: i64,
        offset: i64,
    ) -> Result<OffsetMove, Error> {
        if let Err(nul) = std::ffi::CString::new(stream) {
            return Err(Error::Sql(rusqlite::Error::NulError(nul)));
        }
        let stream = stream.to_owned();
        let moved = self
            .write(move |c| crate::tx::move_watermark(c, &stream, partition, offset))
            .await?;
        Ok(if moved {
            OffsetMove::Advanced
        } else {
            OffsetMove::Replay
        })
    }
}
