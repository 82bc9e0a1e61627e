//! A failover behind one address, as a virtual IP makes it: the primary the tier is connected to
//! becomes a replica, and the address leads to the new primary. The open connection still
//! reaches the old one, which refuses every write (`READONLY`), or every call (`MASTERDOWN`,
//! when it serves no stale data and cannot reach its primary); the tier connects anew.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::Begun;
use oncebox_testkit::run;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{Namespace, PrivateRedis, event, query, raw, wait_until};
use crate::lease::leased;

const TTL: Duration = Duration::from_secs(30);

/// The address clients dial: each new connection goes to the server it leads to then; open
/// ones stay where they went.
struct VirtualIp {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
}

impl VirtualIp {
    async fn start(target: SocketAddr) -> VirtualIp {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let leads = Arc::clone(&target);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let to = *leads.lock().unwrap();
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        VirtualIp { addr, target }
    }

    fn move_to(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = target;
    }
}

#[test]
fn after_a_failover_behind_one_address_the_tier_writes_to_the_new_primary() {
    let (Some(old), Some(new)) = (PrivateRedis::start(), PrivateRedis::start()) else {
        return;
    };
    run(async move {
        let (vip, ns, redis, mut demoted) = connected_to(&old).await;
        // The failover: the old primary follows the new one, and the address leads there.
        let port = new.addr().port().to_string();
        let _: String = query(&mut demoted, "REPLICAOF", &["127.0.0.1", &port]).await;
        vip.move_to(new.addr());
        wait_until(
            "the old primary is a replica",
            Duration::from_secs(10),
            || {
                let mut c = demoted.clone();
                async move {
                    let info: String = query(&mut c, "INFO", &["replication"]).await;
                    info.contains("role:slave")
                }
            },
        )
        .await;

        // The first write after it reaches the demoted server, is refused, and is sent again on
        // a new connection, which the address leads to the new primary.
        begun_on_the_new_primary(&redis, &ns, &mut demoted, "READONLY", &new).await;
        drop((old, new));
    });
}

/// The demoted server serves no stale data and cannot reach the primary it was told to follow
/// (a partition): it answers `MASTERDOWN` to every call, which the tier took for an outage for
/// as long as its connection stayed open.
#[test]
fn a_demoted_server_answering_masterdown_is_left_for_the_new_primary() {
    let (Some(old), Some(new)) = (PrivateRedis::start(), PrivateRedis::start()) else {
        return;
    };
    run(async move {
        let (vip, ns, redis, mut demoted) = connected_to(&old).await;
        let _: String = query(
            &mut demoted,
            "CONFIG",
            &["SET", "replica-serve-stale-data", "no"],
        )
        .await;
        // A primary nobody listens for: the link to it stays down.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = gone.local_addr().unwrap().port().to_string();
        drop(gone);
        let _: String = query(&mut demoted, "REPLICAOF", &["127.0.0.1", &port]).await;
        vip.move_to(new.addr());

        begun_on_the_new_primary(&redis, &ns, &mut demoted, "MASTERDOWN", &new).await;
        drop((old, new));
    });
}

/// A lease begun after the failover: the demoted server refused it once (`refusal` counted in
/// its error stats), and it was taken on the new primary.
async fn begun_on_the_new_primary(
    redis: &oncebox_redis::Leases,
    ns: &Namespace,
    demoted: &mut redis::aio::MultiplexedConnection,
    refusal: &str,
    new: &PrivateRedis,
) {
    let after = redis.begin(&event("after", 1), TTL).await;
    assert!(matches!(after, Ok(Begun::Leased(_))), "{after:?}");
    let errors: String = query(demoted, "INFO", &["errorstats"]).await;
    assert!(
        errors.contains(&format!("errorstat_{refusal}:count=1")),
        "the old connection was refused as a replica's: {errors}"
    );
    let mut primary = raw(&new.url()).await;
    let record = ns.record(&event("after", 1).key);
    let held: i64 = query(&mut primary, "EXISTS", &[&record]).await;
    assert_eq!(held, 1, "the lease is on the new primary");
}

/// The tier connected through a virtual IP leading to `old`, with a lease taken there, and a
/// connection of the test's own to `old`, which the failover demotes.
async fn connected_to(
    old: &PrivateRedis,
) -> (
    VirtualIp,
    Namespace,
    oncebox_redis::Leases,
    redis::aio::MultiplexedConnection,
) {
    let vip = VirtualIp::start(old.addr()).await;
    let ns = Namespace::new(&format!("redis://{}", vip.addr));
    let redis = ns.leases().await;
    let _before = leased(redis.begin(&event("before", 1), TTL).await);
    (vip, ns, redis, raw(&old.url()).await)
}
