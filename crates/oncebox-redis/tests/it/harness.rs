//! Test plumbing: a namespace of its own per test on the shared Redis (cleaned up on drop), a
//! private `redis-server` the test may kill, polling with a deadline, and the D/L/F figures.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oncebox_core::{Event, Key};
use oncebox_redis::{Leases, Options};
use oncebox_testkit::proxy::Proxy;
use oncebox_testkit::service_url;
use redis::Commands as _;
use redis::aio::MultiplexedConnection;

/// A namespace no other test or user of the shared Redis writes; its keys are deleted on drop
/// (a failed test included), so the shared Redis is never flushed.
#[derive(Debug)]
pub struct Namespace {
    pub name: String,
    url: String,
}

impl Namespace {
    pub fn new(url: &str) -> Namespace {
        Namespace {
            name: format!("oncebox-test-{}", uuid::Uuid::new_v4()),
            url: url.to_owned(),
        }
    }

    pub fn options(&self) -> Options {
        Options::new(&self.name)
    }

    pub async fn leases(&self) -> Leases {
        Leases::connect(&self.url, self.options())
            .await
            .expect("connect to Redis")
    }

    /// The record's Redis key, spelled as the crate's docs state it.
    pub fn record(&self, key: &Key) -> String {
        format!("{}:k:{}:{}", self.name, key.source, key.event_id)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            return; // a private server already stopped: nothing to clean
        };
        let pattern = format!("{}:*", self.name);
        let keys: Vec<Vec<u8>> = conn
            .scan_match::<_, Vec<u8>>(&pattern)
            .map(|it| it.filter_map(Result::ok).collect())
            .unwrap_or_default();
        for key in keys {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query(&mut conn);
        }
    }
}

/// The shared Redis of `ONCEBOX_REDIS_URL`, or `None` (the test skips; a failure under
/// `ONCEBOX_REQUIRE_SERVICES=1`).
pub fn shared() -> Option<String> {
    service_url("ONCEBOX_REDIS_URL")
}

/// A plain connection for looking at what Redis holds (PTTL, EXISTS, DBSIZE).
pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection to Redis")
}

/// A proxy in front of the shared Redis (`marker`: see `Proxy::start_with_marker`) and the URL
/// that reaches Redis through it.
pub async fn proxied(url: &str, marker: Option<&[u8]>) -> (Proxy, String) {
    let server = redis::Client::open(url).unwrap();
    let info = server.get_connection_info();
    let upstream = tokio::net::lookup_host(info.addr().to_string())
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::start_with_marker(upstream, marker.map(<[u8]>::to_vec)).await;
    let via = url.replacen(&info.addr().to_string(), &proxy.addr().to_string(), 1);
    (proxy, via)
}

/// The Redis host's clock in ms (`TIME`), the clock a lease's `until` is dated by.
pub async fn redis_now(conn: &mut MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = query(conn, "TIME", &[]).await;
    secs * 1000 + micros / 1000
}

pub async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    cmd: &str,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(cmd);
    for a in args {
        c.arg(*a);
    }
    c.query_async(conn).await.expect(cmd)
}

/// Polls `check` every few milliseconds until it holds; panics after `within`. Waiting for a
/// TTL to lapse is observed in Redis, never assumed from a sleep.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A JSON event `shop`/`id` with payload `{"n": n}`.
pub fn event(id: &str, n: i64) -> Event {
    Event::json(Key::parse("shop", id).unwrap(), format!(r#"{{"n":{n}}}"#)).unwrap()
}

/// Prints one line of figures for a scenario and requires D, L and F to be zero.
pub fn report(scenario: &str, d: usize, l: usize, f: usize, exercised: &str) {
    eprintln!("scenario={scenario} D={d} L={l} F={f} {exercised}");
    assert_eq!((d, l, f), (0, 0, 0), "{scenario}: D/L/F must be zero");
}

/// A `redis-server` of the test's own, without persistence, on a free loopback port: killing
/// and starting it again is a Redis restarted empty, without touching the shared one.
#[derive(Debug)]
pub struct PrivateRedis {
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// More arguments for `redis-server` (a TLS port, its certificate).
    extra: Vec<String>,
}

impl PrivateRedis {
    /// `None` (skip) when there is no `redis-server`; a failure under
    /// `ONCEBOX_REQUIRE_SERVICES=1`.
    pub fn start() -> Option<PrivateRedis> {
        PrivateRedis::start_with(Vec::new())
    }

    /// [`PrivateRedis::start`] with more arguments for `redis-server`.
    pub fn start_with(extra: Vec<String>) -> Option<PrivateRedis> {
        let Some(binary) = find_redis_server() else {
            let required = std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "redis-server not found (ONCEBOX_REDIS_SERVER, PATH, /usr/bin) and \
                 ONCEBOX_REQUIRE_SERVICES=1: \
                 this test starts and kills its own Redis"
            );
            eprintln!("SKIPPED: redis-server not found; this test starts and kills its own Redis");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut redis = PrivateRedis {
            binary,
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            extra,
        };
        redis.spawn();
        Some(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// SIGKILL, then a new process on the same port: no persistence, so it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        // Ready when it answers PING; a process that exited (port taken) fails here.
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).unwrap();
        loop {
            if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200))
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("redis-server on port {} exited: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `ONCEBOX_REDIS_SERVER` when set (and only it), else `redis-server` on the PATH or in the
/// usual directories.
fn find_redis_server() -> Option<PathBuf> {
    if let Some(given) = std::env::var_os("ONCEBOX_REDIS_SERVER") {
        let given = PathBuf::from(given);
        return given.is_file().then_some(given);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
}
