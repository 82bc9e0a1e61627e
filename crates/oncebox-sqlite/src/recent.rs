//! The first answers of recently committed keys, kept in memory so that a prompt retry is
//! answered without a read transaction.
//!
//! Why: the most common duplicate is a sender retrying seconds after its first delivery (a
//! timeout on its side, a redelivery after a reconnect). Looking the key up on a reader costs a
//! read transaction and a walk down the key index: about 8 µs of request-thread CPU per
//! duplicate in the gateway benchmark, a third of that thread's work. Here it is one hash
//! lookup.
//!
//! What makes this safe: an entry is put only after the key's record committed, and it holds
//! exactly what that record answers every later duplicate — its fingerprint and first answer,
//! which never change while the record exists (G3). A request whose fingerprint differs is
//! not answered from here: it takes the usual way, which records the conflict. The one thing
//! that removes a record is a purge; a purge through this inbox empties the memory. A purge by
//! another process on the same file (`oncebox purge` beside a running gateway) cannot, so for
//! at most `capacity` newer keys this process may still answer such a key as a duplicate: the
//! effect happened once and is not repeated, which is the direction G1 allows.
//!
//! Bounded: the oldest entry leaves first (per shard), whatever was looked up since — a retry
//! window, not a cache of popular keys.
//!
//! Each shard keeps its entries in a ring of fixed size, and its map holds only a key's hash
//! and its slot (16 bytes). Why: with the entries themselves in the map (about 130 bytes each),
//! every eviction left a tombstone, and every few thousand puts the map rehashed its megabyte
//! in place; with a shard's map and the cache misses of its probes, `put` was 6% of the
//! gateway's request-thread CPU with new events only (a profile of the gateway benchmark),
//! and is about 2% now, 3% while the rings still fill. A slot is overwritten in insertion
//! order, which is the eviction order.
//!
//! A slot keeps one buffer from one key to the next, holding the key's two strings and the
//! answer's body: a put with the ring full writes into the evicted entry's memory instead of
//! freeing its three blocks and allocating three more. Those blocks were the oldest memory of
//! the process, long out of every cache, and the allocator handed them straight back to the
//! next request's allocations, a cache miss each.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use oncebox_core::{Fingerprint, Key, Response, ResponseKind};

/// Independent locks, so callers rarely meet on one.
const SHARDS: u64 = 16;

pub(crate) struct Recent {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// How many times everything was forgotten. An answer read before a purge may be put
    /// after it forgot everything, its record deleted since: `put` takes only an answer read
    /// under the current count.
    cleared: AtomicU64,
}

/// Entries in a ring, found by the key's hash, which is computed once per call and used as
/// is: a key's strings are hashed once, not again by the map. Two live keys with one hash
/// share a slot; the second is then simply not remembered, and `get` compares the whole key.
#[derive(Default)]
struct Shard {
    /// The ring slot of each remembered key, by its hash.
    slots: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
    /// Entries with their hash; grows to `capacity`, then `next` is overwritten.
    ring: Vec<(u64, Entry)>,
    /// The slot the next entry takes: the oldest, once the ring is full.
    next: usize,
    capacity: usize,
}

struct Entry {
    /// The key's source, its event id, then the answer's body.
    bytes: Vec<u8>,
    source_len: usize,
    event_id_len: usize,
    fingerprint: Fingerprint,
    kind: ResponseKind,
}

impl Entry {
    fn new(key: &Key, fingerprint: Fingerprint, answer: &Response) -> Entry {
        let mut entry = Entry {
            bytes: Vec::new(),
            source_len: 0,
            event_id_len: 0,
            fingerprint,
            kind: answer.kind,
        };
        entry.refill(key, fingerprint, answer);
        entry
    }

    /// Holds `key` and its answer instead, in the same buffer.
    fn refill(&mut self, key: &Key, fingerprint: Fingerprint, answer: &Response) {
        let (source, event_id) = (key.source.as_str(), key.event_id.as_str());
        self.bytes.clear();
        self.bytes.extend_from_slice(source.as_bytes());
        self.bytes.extend_from_slice(event_id.as_bytes());
        self.bytes.extend_from_slice(&answer.body);
        self.source_len = source.len();
        self.event_id_len = event_id.len();
        self.fingerprint = fingerprint;
        self.kind = answer.kind;
    }

    fn is(&self, key: &Key) -> bool {
        let (source, rest) = self.bytes.split_at(self.source_len.min(self.bytes.len()));
        let event_id = rest.get(..self.event_id_len);
        source == key.source.as_str().as_bytes()
            && event_id == Some(key.event_id.as_str().as_bytes())
    }

    fn answer(&self) -> Response {
        Response {
            kind: self.kind,
            body: self
                .bytes
                .get(self.source_len + self.event_id_len..)
                .unwrap_or_default()
                .to_vec(),
        }
    }
}

/// The map's hasher for keys that already are hashes.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; this keeps any other use correct, if slower.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl Recent {
    /// Keeps about `capacity` keys; zero keeps none.
    pub fn new(capacity: usize) -> Recent {
        // Sized up front: a capacity past any memory made `open` panic (`capacity overflow`)
        // or abort.
        let capacity = capacity.min(crate::options::MAX_RECENT_ANSWERS);
        let per_shard = capacity.div_ceil(SHARDS as usize);
        Recent {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        slots: HashMap::with_capacity_and_hasher(per_shard, Default::default()),
                        // Sized once, like the map: grown by doubling, the ring was copied
                        // (up to `per_shard` entries) under the shard's lock on a request's
                        // path while it filled.
                        ring: Vec::with_capacity(per_shard),
                        next: 0,
                        capacity: per_shard,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            cleared: AtomicU64::new(0),
        }
    }

    /// Read before looking a key up or asking the writer for it; given back to [`Recent::put`].
    pub fn generation(&self) -> u64 {
        self.cleared.load(Ordering::SeqCst)
    }

    /// The key's hash and its shard. The shard comes from middle bits: the map takes its
    /// bucket from the low bits and its tags from the top ones, which must all still vary
    /// within one shard.
    fn shard(&self, key: &Key) -> Option<(u64, MutexGuard<'_, Shard>)> {
        let hash = self.hasher.hash_one(key);
        let index = usize::try_from((hash >> 32) % SHARDS).ok()?;
        // A poisoned shard (a panic while holding it) is only a lost memory: skip it.
        Some((hash, self.shards.get(index)?.lock().ok()?))
    }

    /// The committed first answer of `key` if it is remembered with this very fingerprint.
    pub fn get(&self, key: &Key, fingerprint: &Fingerprint) -> Option<Response> {
        let (hash, shard) = self.shard(key)?;
        let (_, entry) = shard.ring.get(*shard.slots.get(&hash)?)?;
        (entry.fingerprint == *fingerprint && entry.is(key)).then(|| entry.answer())
    }

    /// Remembers a committed key's first answer, read after [`Recent::generation`] said
    /// `since`: not if everything was forgotten since, when its record may be gone. Call only
    /// after its commit.
    pub fn put(&self, key: &Key, fingerprint: Fingerprint, answer: &Response, since: u64) {
        let Some((hash, mut shard)) = self.shard(key) else {
            return;
        };
        // Under the shard's lock: a `clear` counting after this reading empties this shard
        // only once this put is done.
        if self.generation() != since || shard.capacity == 0 || shard.slots.contains_key(&hash) {
            return;
        }
        let slot = shard.next;
        shard.next = (slot + 1) % shard.capacity;
        if let Some((taken, entry)) = shard.ring.get_mut(slot) {
            let oldest = std::mem::replace(taken, hash);
            entry.refill(key, fingerprint, answer);
            shard.slots.remove(&oldest);
        } else {
            // Still filling: `slot` is the ring's length.
            shard
                .ring
                .push((hash, Entry::new(key, fingerprint, answer)));
        }
        shard.slots.insert(hash, slot);
    }

    /// Forgets everything: records may have been deleted.
    pub fn clear(&self) {
        // Counted first: a put that reads the old count holds its shard's lock, so the loop
        // below empties that shard after it.
        self.cleared.fetch_add(1, Ordering::SeqCst);
        for shard in &self.shards {
            if let Ok(mut shard) = shard.lock() {
                shard.slots.clear();
                shard.ring.clear();
                shard.next = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::{EventId, Key, Response, Source};

    use super::*;

    fn key(id: &str) -> Key {
        Key::new(Source::new("s").unwrap(), EventId::new(id).unwrap())
    }

    fn fp(b: u8) -> Fingerprint {
        Fingerprint::from([b; 32])
    }

    #[test]
    fn answers_only_the_same_fingerprint() {
        let recent = Recent::new(64);
        recent.put(&key("a"), fp(1), &Response::completed("first"), 0);
        assert_eq!(
            recent.get(&key("a"), &fp(1)),
            Some(Response::completed("first"))
        );
        assert_eq!(
            recent.get(&key("a"), &fp(2)),
            None,
            "a conflict goes the usual way"
        );
        assert_eq!(recent.get(&key("b"), &fp(1)), None);
    }

    #[test]
    fn the_first_answer_stays_and_the_oldest_key_leaves_first() {
        // One key per shard at most: the second put into a full shard evicts the first.
        let recent = Recent::new(SHARDS as usize);
        recent.put(&key("a"), fp(1), &Response::completed("first"), 0);
        recent.put(&key("a"), fp(1), &Response::completed("second"), 0);
        assert_eq!(
            recent.get(&key("a"), &fp(1)),
            Some(Response::completed("first"))
        );
        let kept = (0..200)
            .map(|i| key(&format!("k{i}")))
            .inspect(|k| recent.put(k, fp(1), &Response::completed("x"), 0))
            .collect::<Vec<_>>();
        let remembered = kept
            .iter()
            .filter(|k| recent.get(k, &fp(1)).is_some())
            .count();
        assert!(remembered <= SHARDS as usize, "bounded: {remembered}");
        assert!(remembered > 0);
        assert!(
            recent.get(kept.last().unwrap(), &fp(1)).is_some(),
            "the newest key is kept"
        );
    }

    #[test]
    fn each_shard_keeps_exactly_its_newest_keys_also_after_clear() {
        let recent = Recent::new(SHARDS as usize * 4);
        let shard_of = |k: &Key| (recent.hasher.hash_one(k) >> 32) % SHARDS;
        for round in 0..2 {
            let keys: Vec<Key> = (0..1000).map(|i| key(&format!("r{round}-{i}"))).collect();
            for k in &keys {
                recent.put(k, fp(1), &Response::completed("x"), recent.generation());
            }
            for shard in 0..SHARDS {
                let mine: Vec<&Key> = keys.iter().filter(|k| shard_of(k) == shard).collect();
                let (old, newest) = mine.split_at(mine.len().saturating_sub(4));
                assert!(
                    newest.iter().all(|k| recent.get(k, &fp(1)).is_some()),
                    "shard {shard} lost one of its 4 newest keys"
                );
                assert!(
                    old.iter().all(|k| recent.get(k, &fp(1)).is_none()),
                    "shard {shard} kept an evicted key"
                );
            }
            recent.clear();
        }
    }

    /// A slot refilled with a longer or a shorter key and answer holds exactly the new ones, and
    /// the key's two strings stay two: ("ab", "c") is not ("a", "bc").
    #[test]
    fn a_reused_slot_holds_exactly_its_new_key_and_answer() {
        let two = |s: &str, id: &str| Key::new(Source::new(s).unwrap(), EventId::new(id).unwrap());
        let mut entry = Entry::new(&two("ab", "c"), fp(1), &Response::completed("short"));
        assert!(entry.is(&two("ab", "c")));
        assert!(!entry.is(&two("a", "bc")));
        assert!(!entry.is(&two("ab", "cd")));
        let long = Response::rejected("a much longer first answer than before");
        entry.refill(&two("source-with-a-long-name", "evt_1"), fp(2), &long);
        assert!(entry.is(&two("source-with-a-long-name", "evt_1")));
        assert!(!entry.is(&two("ab", "c")));
        assert_eq!(entry.answer(), long);
        assert_eq!(entry.fingerprint, fp(2));
        entry.refill(&two("s", "e"), fp(3), &Response::completed(""));
        assert!(entry.is(&two("s", "e")));
        assert_eq!(entry.answer(), Response::completed(""));
    }

    #[test]
    fn zero_capacity_keeps_nothing_and_clear_forgets() {
        let none = Recent::new(0);
        none.put(&key("a"), fp(1), &Response::completed("x"), 0);
        assert_eq!(none.get(&key("a"), &fp(1)), None);
        let recent = Recent::new(64);
        recent.put(&key("a"), fp(1), &Response::completed("x"), 0);
        recent.clear();
        assert_eq!(recent.get(&key("a"), &fp(1)), None);
    }

    /// An answer read before a purge forgot everything is not remembered after it: its record
    /// may be among those the purge deleted. One read after it is.
    #[test]
    fn an_answer_read_before_a_clear_is_not_put_after_it() {
        let recent = Recent::new(64);
        let before = recent.generation();
        recent.clear();
        recent.put(&key("a"), fp(1), &Response::completed("x"), before);
        assert_eq!(recent.get(&key("a"), &fp(1)), None);
        recent.put(
            &key("a"),
            fp(1),
            &Response::completed("x"),
            recent.generation(),
        );
        assert!(recent.get(&key("a"), &fp(1)).is_some());
    }
}
