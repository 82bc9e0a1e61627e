//! SQLite's own page cache, wrapped so that B-tree rebalancing does not make every commit scan
//! the whole cache.
//!
//! Why: when `balance_nonroot` puts sibling pages back in ascending order it swaps two page
//! numbers through a temporary one, the locking page (`PENDING_BYTE / page_size + 1`, 262 145
//! for 4 KiB pages). The page cache (`pcache1`) then believes pages up to that number may be
//! cached, and the truncation it runs at the end of every write transaction walks its entire
//! hash table — one cache miss per cached page — instead of the few slots past the file's end.
//! With random keys (UUIDs) almost every group commit rebalances, and that walk was a quarter
//! to a third of the writer thread's time with a 64 MiB cache.
//!
//! The wrapper forwards every call to the built-in cache and changes one thing: the temporary
//! number is stored under key 0, a page number SQLite never uses, so the cache's highest key
//! stays at the file's real end. The swap is three renames in a row with nothing in between,
//! so no page is ever found under the temporary key at a truncation; if one were, it is renamed
//! back first and the built-in cache drops it exactly as it would have.
//!
//! SQLite takes a page cache only before it initializes, so [`install`] runs before this crate
//! opens its first connection. If SQLite was already initialized by other code in the process,
//! the built-in cache stays in place: slower commits, the same results.
#![allow(unsafe_code, reason = "SQLite's page-cache interface is a C vtable")]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::ffi;

/// SQLite's locking-page offset (1 GiB); no page starts there, so its number is free as a
/// temporary one, which is why `balance_nonroot` uses it.
const PENDING_BYTE: c_uint = 0x4000_0000;

/// The built-in methods this wrapper forwards to.
struct Inner(ffi::sqlite3_pcache_methods2);

// SAFETY: the methods table holds function pointers and `pArg`, which SQLite's built-in cache
// leaves null and never mutates; the table is written once, before any use.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

static INNER: OnceLock<Inner> = OnceLock::new();
static INSTALLED: OnceLock<bool> = OnceLock::new();
/// Pages that went through the temporary number, for tests that must see the wrapper at work.
static PARKED: AtomicU64 = AtomicU64::new(0);

/// One cache: the built-in one, and the temporary page number for its page size.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    temporary: c_uint,
}

/// Installs the wrapper once per process; returns whether it is in place.
pub(crate) fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        let mut builtin = ffi::sqlite3_pcache_methods2 {
            iVersion: 0,
            pArg: std::ptr::null_mut(),
            xInit: None,
            xShutdown: None,
            xCreate: None,
            xCachesize: None,
            xPagecount: None,
            xFetch: None,
            xUnpin: None,
            xRekey: None,
            xTruncate: None,
            xDestroy: None,
            xShrink: None,
        };
        // SAFETY: both calls follow sqlite3_config's documented argument types; they fail with
        // SQLITE_MISUSE, changing nothing, once SQLite is initialized.
        unsafe {
            if ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, &raw mut builtin)
                != ffi::SQLITE_OK
                || builtin.iVersion < 1
            {
                return false;
            }
            if INNER.set(Inner(builtin)).is_err() {
                return false;
            }
            let wrapper = ffi::sqlite3_pcache_methods2 {
                iVersion: 1,
                pArg: std::ptr::null_mut(),
                xInit: Some(init),
                xShutdown: Some(shutdown),
                xCreate: Some(create),
                xCachesize: Some(cachesize),
                xPagecount: Some(pagecount),
                xFetch: Some(fetch),
                xUnpin: Some(unpin),
                xRekey: Some(rekey),
                xTruncate: Some(truncate),
                xDestroy: Some(destroy),
                xShrink: Some(shrink),
            };
            // SQLite copies the table.
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &raw const wrapper) == ffi::SQLITE_OK
        }
    })
}

/// Whether the stores' page cache is the wrapped one in this process (it cannot be once SQLite
/// started up before a store opened).
pub fn page_cache_wrapped() -> bool {
    INSTALLED.get().copied().unwrap_or(false)
}

/// How many pages have been renamed through the temporary number since the process started.
pub fn parked_pages() -> u64 {
    PARKED.load(Ordering::Relaxed)
}

fn inner() -> &'static ffi::sqlite3_pcache_methods2 {
    // Only reachable through the wrapper, which is configured after INNER is set.
    &INNER
        .get()
        .expect("page cache wrapper used before install")
        .0
}

/// The key the built-in cache stores for page number `key`.
fn stored(cache: &Cache, key: c_uint) -> c_uint {
    if key == cache.temporary { 0 } else { key }
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    let m = inner();
    // SAFETY: forwarding with the built-in cache's own argument.
    m.xInit.map_or(ffi::SQLITE_OK, |f| unsafe { f(m.pArg) })
}

unsafe extern "C" fn shutdown(_: *mut c_void) {
    let m = inner();
    if let Some(f) = m.xShutdown {
        // SAFETY: as in `init`.
        unsafe { f(m.pArg) }
    }
}

unsafe extern "C" fn create(
    sz_page: c_int,
    sz_extra: c_int,
    purgeable: c_int,
) -> *mut ffi::sqlite3_pcache {
    let Some(f) = inner().xCreate else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding SQLite's arguments unchanged.
    let built = unsafe { f(sz_page, sz_extra, purgeable) };
    if built.is_null() {
        return built;
    }
    let page = c_uint::try_from(sz_page).unwrap_or(1).max(1);
    Box::into_raw(Box::new(Cache {
        inner: built,
        temporary: PENDING_BYTE / page + 1,
    }))
    .cast()
}

/// The wrapper's cache behind SQLite's handle.
///
/// # Safety
/// `p` must come from `create` and not yet be passed to `destroy`.
unsafe fn cache<'a>(p: *mut ffi::sqlite3_pcache) -> &'a Cache {
    // SAFETY: per the contract, `p` is a live `Box<Cache>`; SQLite serializes calls per cache.
    unsafe { &*p.cast::<Cache>() }
}

unsafe extern "C" fn cachesize(p: *mut ffi::sqlite3_pcache, n: c_int) {
    // SAFETY: SQLite passes handles from `create`; forwarding to the built-in cache.
    unsafe {
        if let Some(f) = inner().xCachesize {
            f(cache(p).inner, n);
        }
    }
}

unsafe extern "C" fn pagecount(p: *mut ffi::sqlite3_pcache) -> c_int {
    // SAFETY: as in `cachesize`.
    unsafe { inner().xPagecount.map_or(0, |f| f(cache(p).inner)) }
}

unsafe extern "C" fn fetch(
    p: *mut ffi::sqlite3_pcache,
    key: c_uint,
    create: c_int,
) -> *mut ffi::sqlite3_pcache_page {
    // SAFETY: as in `cachesize`.
    unsafe {
        let c = cache(p);
        inner()
            .xFetch
            .map_or(std::ptr::null_mut(), |f| f(c.inner, stored(c, key), create))
    }
}

unsafe extern "C" fn unpin(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    discard: c_int,
) {
    // SAFETY: as in `cachesize`.
    unsafe {
        if let Some(f) = inner().xUnpin {
            f(cache(p).inner, page, discard);
        }
    }
}

unsafe extern "C" fn rekey(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    old: c_uint,
    new: c_uint,
) {
    // SAFETY: as in `cachesize`.
    unsafe {
        let c = cache(p);
        if new == c.temporary {
            PARKED.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(f) = inner().xRekey {
            f(c.inner, page, stored(c, old), stored(c, new));
        }
    }
}

unsafe extern "C" fn truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    // SAFETY: as in `cachesize`.
    unsafe {
        let c = cache(p);
        let m = inner();
        // A page left under the temporary number (never, with SQLite's own callers) goes back
        // to its real number so the built-in truncation treats it as it always did.
        if c.temporary >= limit
            && let (Some(fetch), Some(rekey)) = (m.xFetch, m.xRekey)
        {
            let parked = fetch(c.inner, 0, 0);
            if !parked.is_null() {
                rekey(c.inner, parked, 0, c.temporary);
            }
        }
        if let Some(f) = m.xTruncate {
            f(c.inner, limit);
        }
    }
}

unsafe extern "C" fn destroy(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: SQLite destroys each handle once; the box is freed after the built-in cache.
    unsafe {
        let c = Box::from_raw(p.cast::<Cache>());
        if let Some(f) = inner().xDestroy {
            f(c.inner);
        }
    }
}

unsafe extern "C" fn shrink(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: as in `cachesize`.
    unsafe {
        if let Some(f) = inner().xShrink {
            f(cache(p).inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::options::Options;

    /// Random keys make SQLite rebalance index pages; the wrapper must see the temporary page
    /// number go by, and the database must stay intact and complete through many commits.
    #[test]
    fn rebalancing_goes_through_the_wrapper_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::schema::open_writer(&Options::new(dir.path().join("p.db"))).unwrap();
        assert!(
            super::install(),
            "the wrapper is in place before the first connection"
        );
        let before = super::parked_pages();
        conn.execute_batch("CREATE TABLE t (k BLOB NOT NULL UNIQUE, v INTEGER)")
            .unwrap();
        for batch in 0..400 {
            conn.execute_batch(&format!(
                "BEGIN; INSERT INTO t (k, v) SELECT randomblob(16), {batch} FROM \
                 (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) \
                 SELECT i FROM n); COMMIT;"
            ))
            .unwrap();
        }
        assert!(
            super::parked_pages() > before,
            "no page went through the temporary number"
        );
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 20_000);
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        // A second connection reads every row back through its own cache.
        let reader = crate::schema::open_reader(&Options::new(dir.path().join("p.db"))).unwrap();
        let found: i64 = reader
            .query_row(
                "SELECT count(*) FROM t WHERE k IN (SELECT k FROM t)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 20_000);
    }
}
