//! Gateway tests: through the real router in-process and through a real listener, on real
//! SQLite files.

mod admin;
mod bodies;
mod conflicts;
mod dashboard;
mod dashboard_gate;
mod deliveries;
mod headers;
mod held;
mod http;
mod ids;
mod ingress;
mod keepalive;
mod keys;
mod linger;
mod openapi;
mod ordering;
mod peers;
mod proxied;
mod rejections;
mod signatures;
mod support;
mod wire;
