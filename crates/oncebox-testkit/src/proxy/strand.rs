//! Connections left without an answer for good ([`super::Mode::Strand`]): what a client sees
//! when the path to its server goes silent under an open connection.

use std::sync::atomic::Ordering;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::Stats;

/// Reads and drops what the client sends, after the `first` bytes already read (and dropped),
/// until it closes the connection, answering nothing. The server's side stays open and unread
/// meanwhile (what it says goes nowhere) and is closed with the client's, as its session would
/// end once it noticed.
pub(super) async fn stranded(
    mut client: TcpStream,
    up: TcpStream,
    first: usize,
    stats: &Stats,
) -> std::io::Result<()> {
    stats.stranded.fetch_add(1, Ordering::SeqCst);
    stats
        .stranded_bytes
        .fetch_add(first as u64, Ordering::SeqCst);
    let _up = up;
    let mut void = vec![0u8; 16 * 1024];
    loop {
        match client.read(&mut void).await {
            Ok(0) | Err(_) => {
                stats.stranded_closed.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Ok(n) => {
                stats.stranded_bytes.fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::super::{Mode, Proxy, Stats};

    #[test]
    fn a_stranded_connection_gets_no_answer_while_others_pass() {
        crate::run(async {
            // What reached the server, in chunks, counted before it echoes them.
            let (server, got) = super::super::tests::echo().await;
            let proxy = Proxy::start_with_marker(server, Some(b"void".to_vec())).await;
            let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
            let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
            let mut buf = [0u8; 4];
            old.write_all(b"hi").await.unwrap();
            old.read_exact(&mut buf[..2]).await.unwrap();
            proxy.set(Mode::Strand);
            old.write_all(b"void").await.unwrap();
            crate::child::until_async(
                "the stranded connection's bytes went nowhere",
                Duration::from_secs(5),
                || Stats::get(&proxy.stats.stranded_bytes) == 4,
            )
            .await;
            old.write_all(b"more").await.unwrap();
            // Bytes without the marker pass, on another connection.
            other.write_all(b"ok").await.unwrap();
            other.read_exact(&mut buf[..2]).await.unwrap();
            assert_eq!(&buf[..2], b"ok", "another connection passes");
            crate::child::until_async(
                "what followed on the stranded connection went nowhere too",
                Duration::from_secs(5),
                || Stats::get(&proxy.stats.stranded_bytes) == 8,
            )
            .await;
            assert_eq!(
                got.load(Ordering::SeqCst),
                2,
                "nothing the stranded connection sent reached the server"
            );
            assert_eq!(Stats::get(&proxy.stats.stranded), 1);
            assert_eq!(Stats::get(&proxy.stats.stranded_closed), 0);
            drop(old);
            crate::child::until_async("the client's close is seen", Duration::from_secs(5), || {
                Stats::get(&proxy.stats.stranded_closed) == 1
            })
            .await;
        });
    }
}
