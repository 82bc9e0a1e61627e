//! What the tests' stand-ins between oncebox and the server share: reading a client's startup
//! message (refusing TLS, so that what passes stays readable) and pointing a URL at the
//! stand-in.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads the client's startup message, answering `N` to a TLS request first, and returns it,
/// with its `options` parameter left out when `drop_options`.
pub async fn startup(client: &mut TcpStream, drop_options: bool) -> Option<Vec<u8>> {
    loop {
        let len = usize::try_from(client.read_u32().await.ok()?).ok()?;
        let mut body = vec![0; len.checked_sub(4)?];
        client.read_exact(&mut body).await.ok()?;
        if body.get(..4) == Some(&80_877_103u32.to_be_bytes()[..]) {
            client.write_all(b"N").await.ok()?;
            continue;
        }
        let mut kept = body[..4].to_vec();
        let mut fields = body[4..].split(|b| *b == 0);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if name.is_empty() || (drop_options && name == b"options") {
                continue;
            }
            for part in [name, value] {
                kept.extend_from_slice(part);
                kept.push(0);
            }
        }
        kept.push(0);
        let mut message = u32::try_from(kept.len() + 4).ok()?.to_be_bytes().to_vec();
        message.extend_from_slice(&kept);
        return Some(message);
    }
}

/// The `host:port` of `base`'s server.
pub fn server(base: &str) -> String {
    let (_, rest) = base.split_once("://").unwrap();
    let (_, hostpath) = rest.rsplit_once('@').unwrap_or(("", rest));
    let host_end = hostpath.find('/').unwrap_or(hostpath.len());
    hostpath[..host_end].to_owned()
}

/// `base` with its server replaced by `proxy` (`host:port`).
pub fn via(base: &str, proxy: &str) -> String {
    let (scheme, rest) = base.split_once("://").unwrap();
    let (auth, hostpath) = rest.rsplit_once('@').unwrap_or(("", rest));
    let host_end = hostpath.find('/').unwrap_or(hostpath.len());
    let at = if auth.is_empty() { "" } else { "@" };
    format!("{scheme}://{auth}{at}{proxy}{}", &hostpath[host_end..])
}
