//! A Redis that may evict keys under memory pressure is named at connect: a lease or a done
//! record it drops lets the key be taken again, so only `noeviction` (or no memory limit) keeps
//! what the tier promises. Checked on a private `redis-server`, whose settings the test
//! changes, over RESP2 and RESP3, as a user `CONFIG` is refused to (read from `INFO memory`),
//! and as one refused both.

use oncebox_redis::Leases;
use oncebox_testkit::run;

use crate::harness::{Namespace, PrivateRedis};

fn config_set(url: &str, name: &str, value: &str) {
    let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut c)
        .unwrap();
}

#[test]
fn an_evicting_redis_is_named_at_connect() {
    let Some(server) = PrivateRedis::start() else {
        return;
    };
    run(async move {
        let url = server.url();
        let connect = async || {
            Leases::connect(&url, Namespace::new(&url).options())
                .await
                .unwrap()
        };
        // No memory limit: nothing is ever evicted, whatever the policy says.
        config_set(&url, "maxmemory-policy", "allkeys-lru");
        assert_eq!(connect().await.eviction_policy(), None);
        config_set(&url, "maxmemory", "100mb");
        assert_eq!(connect().await.eviction_policy(), Some("allkeys-lru"));
        // Leases and records all carry a TTL: the volatile policies evict them too.
        config_set(&url, "maxmemory-policy", "volatile-ttl");
        assert_eq!(connect().await.eviction_policy(), Some("volatile-ttl"));
        // RESP3 answers CONFIG GET with a map: read the same.
        let resp3 = format!("{url}?protocol=resp3");
        let leases = Leases::connect(&resp3, Namespace::new(&url).options()).await;
        assert_eq!(leases.unwrap().eviction_policy(), Some("volatile-ttl"));
        // A user CONFIG is refused to (as managed services do): `INFO memory` tells the
        // same. Refused that too, nothing is known (warned of), and the connection works.
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        for (user, refused) in [("leases", "-config"), ("blind", "-info")] {
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(user)
                .arg("on")
                .arg(">secret")
                .arg("~*")
                .arg("+@all")
                .arg("-config")
                .arg(refused)
                .query(&mut c)
                .unwrap();
        }
        let limited = url.replace("redis://", "redis://leases:secret@");
        let leases = Leases::connect(&limited, Namespace::new(&url).options()).await;
        assert_eq!(leases.unwrap().eviction_policy(), Some("volatile-ttl"));
        let blind = url.replace("redis://", "redis://blind:secret@");
        let leases = Leases::connect(&blind, Namespace::new(&url).options()).await;
        assert_eq!(leases.unwrap().eviction_policy(), None);
        config_set(&url, "maxmemory-policy", "noeviction");
        assert_eq!(connect().await.eviction_policy(), None);
    });
}
