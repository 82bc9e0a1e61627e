//! The cap on request bodies one peer has arriving at once (`limits.bodies_per_peer`).
//!
//! Why: a request holds a permit of the concurrency limit while its body arrives, for up to
//! the body timeout, and the header check before the body needs no secret for every scheme.
//! Without a cap, one client trickling bodies on enough connections holds every permit, and
//! every real sender is answered 503 for as long as it keeps at it. A body is counted only
//! while the server waits for it (its read found nothing there), so a request that arrives
//! whole in the server's first read (up to 8 KiB, head included, without `Expect:
//! 100-continue`), as most webhook senders' do, is never counted, however many come at once; a
//! longer one, or one that waits for `100 Continue`, is counted for the round trip or so its
//! body takes. A request that would wait past its peer's cap is answered 503 and its
//! connection closed.
//!
//! A peer is an IPv4 address, or an IPv6 /64 (one host's usual share of addresses; an
//! IPv4-mapped address is its IPv4 one). Behind a proxy that passes bodies through unbuffered,
//! every sender is the proxy's address: raise the cap there, or set it to 0 (no cap).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Who a body is counted against; shown as an address or a `/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    V4([u8; 4]),
    /// The first 64 bits.
    V6([u8; 8]),
}

impl Peer {
    pub(crate) fn of(ip: IpAddr) -> Peer {
        let v6 = match ip {
            IpAddr::V4(v4) => return Peer::V4(v4.octets()),
            IpAddr::V6(v6) => v6,
        };
        if let Some(v4) = v6.to_ipv4_mapped() {
            return Peer::V4(v4.octets());
        }
        let mut prefix = [0; 8];
        prefix.copy_from_slice(&v6.octets()[..8]);
        Peer::V6(prefix)
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Peer::V4(octets) => std::net::Ipv4Addr::from(octets).fmt(f),
            Peer::V6(prefix) => {
                let mut octets = [0; 16];
                octets[..8].copy_from_slice(&prefix);
                write!(f, "{}/64", std::net::Ipv6Addr::from(octets))
            }
        }
    }
}

/// Bodies arriving now, per peer with any.
#[derive(Debug)]
pub(crate) struct Peers {
    cap: usize,
    arriving: Mutex<HashMap<Peer, usize>>,
}

impl Peers {
    /// `None` for a cap of 0: nothing is counted.
    pub(crate) fn new(cap: usize) -> Option<Arc<Peers>> {
        (cap > 0).then(|| {
            Arc::new(Peers {
                cap,
                arriving: Mutex::new(HashMap::new()),
            })
        })
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Counts one more body of `peer` arriving, until the guard drops; `None` past the cap.
    pub(crate) fn enter(self: &Arc<Peers>, peer: Peer) -> Option<Arriving> {
        // A panic elsewhere while holding the lock left the counts whole (each change is one
        // statement): they are still right.
        let mut arriving = self.arriving.lock().unwrap_or_else(PoisonError::into_inner);
        let count = arriving.entry(peer).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(Arriving {
            peers: Arc::clone(self),
            peer,
        })
    }

    #[cfg(test)]
    fn count(&self, peer: Peer) -> usize {
        let arriving = self.arriving.lock().unwrap_or_else(PoisonError::into_inner);
        arriving.get(&peer).copied().unwrap_or(0)
    }
}

/// One body counted as arriving; dropped when it has arrived or its request ended.
#[derive(Debug)]
pub(crate) struct Arriving {
    peers: Arc<Peers>,
    peer: Peer,
}

impl Drop for Arriving {
    fn drop(&mut self) {
        let mut arriving = self
            .peers
            .arriving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Peers with nothing arriving are removed: the table holds only the slow ones.
        if let Some(count) = arriving.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                arriving.remove(&self.peer);
            }
        }
    }
}

/// A body refused because its peer has as many arriving as the cap allows.
#[derive(Debug)]
pub(crate) struct PeerBusy {
    pub(crate) cap: usize,
}

impl std::fmt::Display for PeerBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this client already has {} request bodies arriving (limits.bodies_per_peer)",
            self.cap
        )
    }
}

impl std::error::Error for PeerBusy {}

/// The [`PeerBusy`] somewhere in `error`'s chain of sources (a body's error reaches its reader
/// wrapped by the layers between).
pub(crate) fn busy_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a PeerBusy> {
    oncebox_core::chain::cause(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_64() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(Peer::of(ip("10.0.0.1")), Peer::of(ip("::ffff:10.0.0.1")));
        assert_ne!(Peer::of(ip("10.0.0.1")), Peer::of(ip("10.0.0.2")));
        assert_eq!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(Peer::of(ip("::ffff:10.0.0.1")).to_string(), "10.0.0.1");
        assert_eq!(
            Peer::of(ip("2001:db8:1:2::1")).to_string(),
            "2001:db8:1:2::/64"
        );
    }

    #[test]
    fn bodies_past_the_cap_are_refused_until_one_has_arrived() {
        assert!(Peers::new(0).is_none(), "0 is no cap");
        let peers = Peers::new(2).expect("a cap");
        let a = Peer::of("10.0.0.1".parse().expect("ip"));
        let b = Peer::of("10.0.0.2".parse().expect("ip"));
        let first = peers.enter(a).expect("one");
        let _second = peers.enter(a).expect("two");
        assert!(peers.enter(a).is_none(), "a third of one peer");
        let other = peers
            .enter(b)
            .expect("another peer is not held by the first's");
        drop(first);
        assert_eq!(peers.count(a), 1);
        assert!(peers.enter(a).is_some(), "a place came free");
        drop(other);
        assert!(
            peers.arriving.lock().expect("lock").get(&b).is_none(),
            "a peer with nothing arriving is forgotten"
        );
    }

    #[test]
    fn busy_is_found_through_wrapping_errors() {
        let wrapped = axum::Error::new(PeerBusy { cap: 3 });
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(wrapped);
        assert_eq!(busy_in(boxed.as_ref()).map(|b| b.cap), Some(3));
        let other: Box<dyn std::error::Error + Send + Sync> = "nope".into();
        assert!(busy_in(other.as_ref()).is_none());
    }
}
