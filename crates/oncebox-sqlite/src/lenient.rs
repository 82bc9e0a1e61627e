//! Reading rows an edit by hand may have left unlike what oncebox writes: SQLite keeps a value
//! of any type in any column. A byte column written as text is still its bytes; a value of
//! another type is refused for its own row, never for everything read beside it.

use rusqlite::Row;
use rusqlite::types::ValueRef;

/// Column `i` as bytes, from a blob or from text.
pub(crate) fn bytes(r: &Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    optional_bytes(r, i)?.ok_or_else(|| {
        rusqlite::Error::InvalidColumnType(i, column(r, i), rusqlite::types::Type::Null)
    })
}

/// Column `i` as bytes or `None` for NULL.
pub(crate) fn optional_bytes(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<Vec<u8>>> {
    match r.get_ref(i)? {
        ValueRef::Null => Ok(None),
        ValueRef::Blob(b) | ValueRef::Text(b) => Ok(Some(b.to_vec())),
        other => Err(rusqlite::Error::InvalidColumnType(
            i,
            column(r, i),
            other.data_type(),
        )),
    }
}

/// Whether `e` says a stored value is not of the type read, rather than that the database
/// could not be read.
pub(crate) fn unreadable(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
    )
}

fn column(r: &Row<'_>, i: usize) -> String {
    r.as_ref().column_name(i).unwrap_or("?").to_owned()
}
