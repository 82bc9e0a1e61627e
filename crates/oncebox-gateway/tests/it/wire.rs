//! A gateway on a real listener and a raw client for it: the bytes a test chooses, read back as
//! whole responses, to stage slow, partial and oversize requests.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use oncebox_gateway::policy::{GatewayConfig, Limits};
use oncebox_sqlite::Options;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{Answer, TestGateway, config};

/// How long a test waits for the server to end what its own timers or shutdown should end.
/// Generous on purpose: the tests assert that it ended, not how fast.
pub(crate) const BOUND: Duration = Duration::from_secs(10);

/// A gateway served on a real listener.
pub(crate) struct Served {
    pub(crate) gw: TestGateway,
    pub(crate) addr: SocketAddr,
    pub(crate) stop: oneshot::Sender<()>,
    pub(crate) server: JoinHandle<()>,
}

/// Serves a fresh gateway with `limits` in both places that read them: the router takes the
/// concurrency limit, body timeout and `Retry-After` from its config, the server loop the
/// header timeout and shutdown grace from its argument.
pub(crate) async fn served(limits: Limits) -> Served {
    let config = GatewayConfig {
        limits: limits.clone(),
        ..config()
    };
    let gw = TestGateway::with(config, Options::new);
    let (addr, stop, server) = gw.listen(limits).await;
    Served {
        gw,
        addr,
        stop,
        server,
    }
}

pub(crate) async fn answer(res: reqwest::Response) -> Answer {
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.bytes().await.expect("response body").to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

pub(crate) async fn deliver(
    client: &reqwest::Client,
    addr: SocketAddr,
    source: &str,
    body: &str,
) -> Answer {
    let res = client
        .post(format!("http://{addr}/v1/sources/{source}/events"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request");
    answer(res).await
}

pub(crate) async fn get(client: &reqwest::Client, addr: SocketAddr, path: &str) -> Answer {
    answer(
        client
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .expect("request"),
    )
    .await
}

/// The head of `POST /v1/sources/{source}/events` declaring `length` body bytes; `extra` holds
/// further header lines, each ending in CRLF.
pub(crate) fn head(source: &str, length: usize, extra: &str) -> String {
    format!(
        "POST /v1/sources/{source}/events HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    )
}

/// How a raw connection's read ended.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A whole response; an interim `100 Continue` counts as one.
    Answer(Answer),
    /// EOF or a connection error before a whole response: the server cut the connection.
    Closed(String),
}

impl Reply {
    pub(crate) fn answer(self) -> Answer {
        match self {
            Reply::Answer(a) => a,
            Reply::Closed(why) => panic!("expected a response, the connection ended: {why}"),
        }
    }
}

/// A client that writes exactly the bytes a test chooses, to stage slow and partial requests.
pub(crate) struct Raw {
    pub(crate) stream: TcpStream,
    pub(crate) buf: Vec<u8>,
}

impl Raw {
    pub(crate) async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    /// Connects from the loopback address `from` (any of 127.0.0.0/8): another client, as the
    /// server tells them apart.
    pub(crate) async fn connect_from(addr: SocketAddr, from: IpAddr) -> Raw {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::new(from, 0)).expect("bind");
        Raw {
            stream: socket.connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    pub(crate) async fn reply(&mut self) -> Reply {
        read_reply(&mut self.stream, &mut self.buf).await
    }
}

/// Reads one response. A hang past [`BOUND`] fails the test: the server never ended something
/// it should have.
pub(crate) async fn read_reply<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> Reply {
    let read = async {
        loop {
            if let Some(answer) = parse(buf, false) {
                return Reply::Answer(answer);
            }
            let mut chunk = [0u8; 8192];
            match rd.read(&mut chunk).await {
                Ok(0) => {
                    return match parse(buf, true) {
                        Some(answer) => Reply::Answer(answer),
                        None => Reply::Closed(format!("eof after {} bytes", buf.len())),
                    };
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Reply::Closed(e.to_string()),
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .unwrap_or_else(|_| panic!("neither a response nor a closed connection within {BOUND:?}"))
}

/// Takes one response off the front of `buf` once it is complete. Without `Content-Length`
/// the body ends with the connection (`eof`); the gateway never answers chunked.
pub(crate) fn parse(buf: &mut Vec<u8>, eof: bool) -> Option<Answer> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).expect("ASCII response head");
    let mut lines = head.split("\r\n");
    let code = lines.next()?.split(' ').nth(1).expect("status line");
    let status = StatusCode::from_bytes(code.as_bytes()).expect("status code");
    let mut headers = HeaderMap::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("header line");
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).expect("header name"),
            HeaderValue::from_str(value.trim()).expect("header value"),
        );
    }
    assert!(
        !headers.contains_key("transfer-encoding"),
        "chunked answer: {head}"
    );
    let length = match headers.get("content-length") {
        _ if status.is_informational() => Some(0),
        Some(v) => Some(v.to_str().ok()?.parse::<usize>().expect("content-length")),
        None => None,
    };
    let total = match length {
        Some(n) => end + n,
        None if eof => buf.len(),
        None => return None,
    };
    if buf.len() < total {
        return None;
    }
    let body = buf[end..total].to_vec();
    buf.drain(..total);
    Some(Answer {
        status,
        headers,
        body,
    })
}

/// Sends the head of `body` to source `open` and its first `sent` bytes, and returns once the
/// handler reads the body. The sync point is `Expect: 100-continue`: hyper sends the interim
/// `100 Continue` only when the handler first polls the body, so by then the request holds its
/// concurrency permit and is in flight.
pub(crate) async fn in_flight(addr: SocketAddr, body: &str, sent: usize) -> Raw {
    in_flight_on(Raw::connect(addr).await, body, sent).await
}

/// [`in_flight`] on a connection of the test's choosing.
pub(crate) async fn in_flight_on(mut raw: Raw, body: &str, sent: usize) -> Raw {
    raw.send(head("open", body.len(), "Expect: 100-continue\r\n").as_bytes())
        .await;
    let interim = raw.reply().await.answer();
    assert_eq!(interim.status, StatusCode::CONTINUE, "{interim:?}");
    raw.send(&body.as_bytes()[..sent]).await;
    raw
}
