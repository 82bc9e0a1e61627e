//! The HTTP benchmark's baseline as a process of its own, to measure `oncebox serve` against it
//! the way the two run in the field: each its own process, loaded by `oncebox bench`.
//!
//! `cargo run --release -p oncebox-gateway --example baseline [-- ADDRESS]` (default
//! 127.0.0.1:8090), then `oncebox bench --url http://127.0.0.1:8090 --no-check`: the baseline
//! stores nothing, so there is nothing to check. It runs on the gateway's own server loop and
//! allocator, so only the handler differs; Ctrl-C stops it.

#![allow(
    clippy::print_stdout,
    reason = "an example reports its address on stdout"
)]

#[path = "../benches/http/baseline.rs"]
mod baseline;

use oncebox_gateway::policy::Limits;

/// The allocator `oncebox serve` runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".into());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("baseline listening on http://{}", listener.local_addr()?);
    oncebox_gateway::serve(listener, baseline::router(), Limits::default(), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
