//! The process's open-file limit, raised to what the system allows before the gateway listens,
//! and weighed against `limits.connections`.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept for everything but connections: the store's files and pool, the relay's
/// own connections, logs.
const RESERVE: u64 = 256;

/// Raises the soft limit on open files to the hard one (many systems start processes at 1 024
/// with a far higher hard limit), and warns when `connections` open at once could still use
/// descriptors the store and the relay need. Why: past the limit `accept` fails, and so does
/// every file or socket the store or the relay then opens.
pub(super) fn raise_open_files(connections: usize) {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    if let Some(warning) = too_few(connections, soft) {
        tracing::warn!("{warning}");
    }
}

/// The warning, when `connections` and the reserve do not fit in `limit` descriptors.
fn too_few(connections: usize, limit: u64) -> Option<String> {
    let wanted = u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_add(RESERVE);
    let fix = match limit.checked_sub(RESERVE).filter(|room| *room > 0) {
        Some(room) => format!("lower limits.connections to {room} or raise the open-file limit"),
        None => "raise the open-file limit".to_owned(),
    };
    (wanted > limit).then(|| {
        format!(
            "limits.connections is {connections}, but this process may open only {limit} files \
             ({RESERVE} of them kept for the store and the relay): {fix} (ulimit -n, \
             LimitNOFILE=)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_past_the_limit_less_the_reserve_are_warned_of() {
        assert_eq!(too_few(10_000, 1 << 20), None);
        assert_eq!(too_few(768, 1024), None);
        let warning = too_few(10_000, 1024).unwrap();
        assert!(
            warning.contains("lower limits.connections to 768"),
            "{warning}"
        );
        // Nothing left to lower it to (macOS starts processes at 256).
        let warning = too_few(10_000, 256).unwrap();
        assert!(!warning.contains("lower"), "{warning}");
        assert!(warning.contains("raise the open-file limit"), "{warning}");
    }
}
