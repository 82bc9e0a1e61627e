//! SQLite files damaged on purpose, the same way by every suite that needs one.

use oncebox_sqlite::rusqlite::Connection;

/// Overwrites the first byte (the b-tree page type) of the inbox's key index's root page, its
/// only page while it holds a few keys, with the file closed; returns what `integrity_check`
/// says of the file afterwards.
pub fn damage_key_index(path: &std::path::Path) -> String {
    let (page_size, root): (i64, i64) = {
        let c = Connection::open(path).expect("open the file to damage");
        let page_size = c
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size");
        let root = c
            .query_row(
                "SELECT rootpage FROM sqlite_schema WHERE tbl_name = 'oncebox_inbox'
                   AND type = 'index' AND sql IS NULL",
                [],
                |r| r.get(0),
            )
            .expect("the key index's root page");
        (page_size, root)
    };
    let mut bytes = std::fs::read(path).expect("read the file");
    let at = usize::try_from((root - 1) * page_size).expect("a page offset");
    assert_eq!(bytes[at], 0x0a, "the root is an index leaf page");
    bytes[at] = 0xff;
    std::fs::write(path, bytes).expect("write the damaged file");
    Connection::open(path)
        .expect("reopen")
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check")
}
