//! What the RabbitMQ and NATS route tests share: route URLs through a fault proxy, the broker's
//! address behind that proxy, a publish cut off before its confirm, and the checks that a
//! publish the broker refused or never saw is retried, never delivered.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::route::Route;
use oncebox_relay::Relay;
use oncebox_sqlite::Inbox;

use crate::{World, broker_route, receiver, with_query};

/// The route URL: the broker URL `base` with `pairs` added to its query, through `proxy` (a
/// local port in front of the broker) when given.
pub fn route_url(base: &str, proxy: Option<SocketAddr>, pairs: &[(&str, &str)]) -> String {
    let mut base = reqwest::Url::parse(base).unwrap();
    if let Some(addr) = proxy {
        base.set_port(Some(addr.port())).unwrap();
    }
    with_query(base.as_str(), pairs)
}

/// The address of the broker that the URL `base` names, for a proxy in front of it.
pub async fn upstream(base: &str, default_port: u16) -> SocketAddr {
    let broker = reqwest::Url::parse(base).unwrap();
    let host = broker.host_str().unwrap();
    let port = broker.port().unwrap_or(default_port);
    tokio::net::lookup_host(format!("{host}:{port}"))
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// One event on a route to `url`, which names something the broker does not have: the broker
/// refuses the publish, so it is retried, with an error containing `error`.
pub async fn refused_publish_is_retried(url: &str, error: &str) {
    let w = World::new();
    w.accept("evt_x", &["broker"]).await;
    // Not idempotent: an unknown outcome would park it; a refused one proves nothing was
    // stored and must not be parked.
    let relay = w.relay(vec![broker_route("broker", url, false)]);
    assert_eq!(relay.run_once().await.unwrap().retrying, 1);
    let d = w.delivery("evt_x").await;
    assert_eq!(d.state, DeliveryState::Retrying);
    let last = d.last_error.unwrap_or_default();
    assert!(last.contains(error), "{last}");
}

/// One event on a route to `url`, whose broker is down: each round retries it, none delivers.
pub async fn broker_down_is_retried(url: &str) {
    let w = World::new();
    w.accept("evt_d", &["broker"]).await;
    let relay = w.relay(vec![broker_route("broker", url, false)]);
    for _ in 0..2 {
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.delivered, out.retrying), (0, 1), "{out:?}");
        w.clock.advance(Duration::from_secs(3600));
    }
    let d = w.delivery("evt_d").await;
    assert_eq!((d.state, d.attempts), (DeliveryState::Retrying, 2));
    assert!(d.last_error.is_some());
}

/// Accepts `id` for the route `route` builds around a proxy to `upstream`, and runs one relay
/// round. The proxy cuts the connection once the message passed (the marker is in its body, so
/// the broker has the whole message): the broker stores it and confirms, the confirm never
/// arrives. Checks that the delivery ended `want`; returns the relay.
pub async fn cut_before_the_confirm(
    w: &World,
    upstream: SocketAddr,
    id: &str,
    route: impl FnOnce(SocketAddr) -> Route,
    want: DeliveryState,
) -> Relay<Inbox> {
    let marker = format!(r#""id":"{id}""#).into_bytes();
    let (proxy, cuts) = receiver::cutting_proxy(upstream, marker).await;
    let route = route(proxy);
    w.accept(id, &[&route.name]).await;
    let relay = w.relay(vec![route]);
    relay.run_once().await.unwrap();
    assert_eq!(cuts.load(Ordering::SeqCst), 1, "the fault happened");
    let d = w.delivery(id).await;
    assert_eq!(d.state, want, "{id}: {:?}", d.last_error);
    relay
}
