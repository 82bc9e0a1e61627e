//! A JetStream stream kept on the test server for good, so that tests creating and deleting
//! streams in parallel never meet nats-server's removal of the account's store directory.
//!
//! Why: nats-server (2.9) removes an account's store directory (`jetstream/$G`) when the
//! account's last stream is deleted. A stream created at that moment fails, "could not create
//! storage directory … no such file or directory" (10077): one test's cleanup failed another
//! test's setup, now and then, when the number of streams on the server touched zero. With one
//! stream that is never deleted, the directory stays. Spoken in NATS's plain text protocol over
//! a blocking socket, so the testkit needs no NATS client; a server it cannot reach or that
//! wants TLS or credentials is left alone (the test then says what is wrong itself).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Once;
use std::time::Duration;

/// The kept stream: file storage (a memory stream keeps no directory), one message at most.
const STREAM: &str = "ONCEBOX_TEST_KEEP";
const CONFIG: &str = r#"{"name":"ONCEBOX_TEST_KEEP","subjects":["_oncebox_test_keep"],"storage":"file","max_msgs":1}"#;

/// Makes sure the kept stream exists on the server `url` names; once per process.
pub(crate) fn keep(url: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = create(url) {
            eprintln!("could not keep a stream on the NATS test server ({e}); going on");
        }
    });
}

/// `host:port` of a `nats://[user:password@]host[:port]` URL, or of a bare `host[:port]`
/// (NATS's port, 4222, when none is given).
fn address(url: &str) -> Option<String> {
    let url = url.trim();
    let rest = url.strip_prefix("nats://").unwrap_or(url);
    let rest = rest.split(['/', '?', ',']).next()?;
    if rest.contains('@') || rest.is_empty() {
        // Credentials: the plain exchange below sends none.
        return None;
    }
    let has_port = rest
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    Some(if has_port {
        rest.to_owned()
    } else {
        format!("{rest}:4222")
    })
}

fn create(url: &str) -> std::io::Result<()> {
    let other = |why: &str| std::io::Error::other(why.to_owned());
    let addr = address(url).ok_or_else(|| other("a URL with credentials"))?;
    let addr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| other("no address"))?;
    // Bounded: a host that drops the connection attempt must not hold every test behind `Once`.
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("INFO") || line.contains("\"tls_required\":true") {
        return Err(other("the server wants TLS"));
    }
    let mut out = &stream;
    // This process's own reply subject: test processes run at once.
    let inbox = format!("_INBOX.oncebox_keep_{}", std::process::id());
    write!(
        out,
        "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB {inbox} 1\r\n\
         PUB $JS.API.STREAM.CREATE.{STREAM} {inbox} {}\r\n{CONFIG}\r\n",
        CONFIG.len()
    )?;
    out.flush()?;
    // The answer (created, or already there with this configuration; JetStream's refusals
    // come as a message too, with an `error`) or an error line.
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(other("the server closed the connection"));
        }
        if line.starts_with("MSG") {
            let size: usize = line
                .split_whitespace()
                .last()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| other("a message line without its size"))?;
            let mut payload = vec![0; size + 2];
            reader.read_exact(&mut payload)?;
            let answer = String::from_utf8_lossy(&payload);
            return if answer.contains("\"error\"") {
                Err(other(answer.trim()))
            } else {
                Ok(())
            };
        }
        if line.starts_with("-ERR") {
            return Err(other(line.trim()));
        }
        if line.starts_with("PING") {
            out.write_all(b"PONG\r\n")?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::address;

    #[test]
    fn the_address_is_the_urls_host_and_port() {
        let of = |url| address(url);
        assert_eq!(
            of("nats://127.0.0.1:4222").as_deref(),
            Some("127.0.0.1:4222")
        );
        assert_eq!(of(" 127.0.0.1:4222\n").as_deref(), Some("127.0.0.1:4222"));
        assert_eq!(of("nats://h:1,nats://h:2").as_deref(), Some("h:1"));
        assert_eq!(of("nats://h").as_deref(), Some("h:4222"));
        assert_eq!(of("nats://u:p@h:1"), None);
    }
}
