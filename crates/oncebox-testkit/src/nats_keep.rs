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

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
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

/// `host:port` of a `nats://[user:password@]host:port` URL, or of a bare `host:port`.
fn address(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("nats://").unwrap_or(url);
    let rest = rest.split(['/', '?', ',']).next()?;
    if rest.contains('@') {
        // Credentials: the plain exchange below sends none.
        return None;
    }
    Some(rest)
}

fn create(url: &str) -> std::io::Result<()> {
    let other = |why: &str| std::io::Error::other(why.to_owned());
    let addr = address(url).ok_or_else(|| other("a URL with credentials"))?;
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("INFO") || line.contains("\"tls_required\":true") {
        return Err(other("the server wants TLS"));
    }
    let mut out = &stream;
    write!(
        out,
        "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB _INBOX.oncebox_keep 1\r\n\
         PUB $JS.API.STREAM.CREATE.{STREAM} _INBOX.oncebox_keep {}\r\n{CONFIG}\r\n",
        CONFIG.len()
    )?;
    out.flush()?;
    // The answer (created, or already there with this configuration) or an error line.
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(other("the server closed the connection"));
        }
        if line.starts_with("MSG") {
            return Ok(());
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
        assert_eq!(address("nats://127.0.0.1:4222"), Some("127.0.0.1:4222"));
        assert_eq!(address("127.0.0.1:4222"), Some("127.0.0.1:4222"));
        assert_eq!(address("nats://h:1,nats://h:2"), Some("h:1"));
        assert_eq!(address("nats://u:p@h:1"), None);
    }
}
