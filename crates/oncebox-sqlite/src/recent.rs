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

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};

use oncebox_core::{Fingerprint, Key, Response};

/// Independent locks, so callers rarely meet on one.
const SHARDS: u64 = 16;

pub(crate) struct Recent {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

/// Entries by the key's hash, which is computed once per call and used as is: a key's
/// strings are hashed once, not again by the map. Two live keys with one hash share a slot;
/// the second is then simply not remembered, and `get` compares the whole key.
#[derive(Default)]
struct Shard {
    entries: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// Insertion order, for eviction.
    order: VecDeque<u64>,
    capacity: usize,
}

struct Entry {
    key: Key,
    fingerprint: Fingerprint,
    answer: Response,
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
        let per_shard = capacity.div_ceil(SHARDS as usize);
        Recent {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        capacity: per_shard,
                        ..Shard::default()
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
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
        let entry = shard.entries.get(&hash)?;
        (entry.key == *key && entry.fingerprint == *fingerprint).then(|| entry.answer.clone())
    }

    /// Remembers a committed key's first answer. Call only after its commit.
    pub fn put(&self, key: Key, fingerprint: Fingerprint, answer: &Response) {
        let Some((hash, mut shard)) = self.shard(&key) else {
            return;
        };
        if shard.capacity == 0 || shard.entries.contains_key(&hash) {
            return;
        }
        while shard.entries.len() >= shard.capacity {
            let Some(oldest) = shard.order.pop_front() else {
                break;
            };
            shard.entries.remove(&oldest);
        }
        shard.order.push_back(hash);
        shard.entries.insert(
            hash,
            Entry {
                key,
                fingerprint,
                answer: answer.clone(),
            },
        );
    }

    /// Forgets everything: records may have been deleted.
    pub fn clear(&self) {
        for shard in &self.shards {
            if let Ok(mut shard) = shard.lock() {
                shard.entries.clear();
                shard.order.clear();
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
        recent.put(key("a"), fp(1), &Response::completed("first"));
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
        recent.put(key("a"), fp(1), &Response::completed("first"));
        recent.put(key("a"), fp(1), &Response::completed("second"));
        assert_eq!(
            recent.get(&key("a"), &fp(1)),
            Some(Response::completed("first"))
        );
        let kept = (0..200)
            .map(|i| key(&format!("k{i}")))
            .inspect(|k| recent.put(k.clone(), fp(1), &Response::completed("x")))
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
    fn zero_capacity_keeps_nothing_and_clear_forgets() {
        let none = Recent::new(0);
        none.put(key("a"), fp(1), &Response::completed("x"));
        assert_eq!(none.get(&key("a"), &fp(1)), None);
        let recent = Recent::new(64);
        recent.put(key("a"), fp(1), &Response::completed("x"));
        recent.clear();
        assert_eq!(recent.get(&key("a"), &fp(1)), None);
    }
}
