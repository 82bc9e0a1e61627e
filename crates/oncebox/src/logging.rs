//! The process's log on stderr: what `RUST_LOG` asks for (`info` without it), but async-nats no
//! more verbose than info and lapin's returned messages no more than error unless `RUST_LOG`
//! names them: async-nats's debug lines print the server address it dials with the password in
//! it, and lapin warns of each message a broker returns with its whole payload and headers.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt as _, FilterFn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Targets whose output carries what a log must not, with the most verbose level let through:
/// async-nats's debug lines (`attempting connection` with the `ServerAddr`, user and password
/// included, in 0.51's connector); lapin's warning for each unroutable message a broker
/// returns (`Server returned us a message` with the message's `Debug`: its payload, byte by
/// byte, and its `idempotency-key` header, in 4.x), which a relay publishing before its queue
/// is declared gets at every attempt, event bodies in the log and a line of megabytes each.
const CAPPED: [(&str, LevelFilter); 2] = [
    ("async_nats", LevelFilter::INFO),
    ("lapin::returned_messages", LevelFilter::ERROR),
];

/// Installs the log for the whole process; called once, first thing in `main`.
pub(crate) fn init() {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let spec = std::env::var("RUST_LOG").ok();
    tracing_subscriber::registry()
        .with(layer(spec.as_deref(), std::io::stderr, ansi))
        .init();
}

/// The formatting layer, filtered by `spec` (a `RUST_LOG` value; `info` when absent or
/// invalid, as before) and by the cap on [`CAPPED`].
fn layer<S, W>(spec: Option<&str>, writer: W, ansi: bool) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = spec
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    // A user who names a capped target asked for its lines, passwords and all: their choice.
    // Only for what they named: `async_nats::jetstream=debug` lifts the cap on that module,
    // not on the connector's line with the password.
    let named: Vec<Vec<String>> = CAPPED
        .iter()
        .map(|(target, _)| spec.map_or_else(Vec::new, |s| named(s, target)))
        .collect();
    // Levels more verbose compare above: `DEBUG` and `TRACE` above `INFO`, all but `ERROR`
    // above it. Its hint is the loosest, so the pair's is `RUST_LOG`'s: without one, `And`
    // has none, the process's level becomes TRACE (every callsite asked, every `log` record
    // converted), and the multinode test's relays stalled.
    let cap = FilterFn::new(move |meta| {
        CAPPED
            .iter()
            .zip(&named)
            .find(|((target, _), _)| is_under(meta.target(), target))
            .is_none_or(|((_, most), named)| {
                named.iter().any(|t| is_under(meta.target(), t)) || *most >= *meta.level()
            })
    })
    .with_max_level_hint(LevelFilter::TRACE);
    tracing_subscriber::fmt::layer()
        .with_writer(writer)
        // Colour codes only for a person at a terminal: a log file, journald or a container's
        // log would keep them as escape sequences.
        .with_ansi(ansi)
        .with_filter(filter.and(cap))
}

/// The targets the directives of `spec` name that are `capped` or one of its modules
/// (`async_nats=debug`, `async_nats::connector[…]=trace`). A mere substring is not enough:
/// `my_async_nats_glue=info` asks nothing of async-nats.
fn named(spec: &str, capped: &str) -> Vec<String> {
    spec.split(',')
        .map(|directive| directive.split(['=', '[']).next().unwrap_or("").trim())
        .filter(|target| is_under(target, capped))
        .map(str::to_owned)
        .collect()
}

/// Whether `target` is `capped` or one of its modules.
fn is_under(target: &str, capped: &str) -> bool {
    target
        .strip_prefix(capped)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// What a log with `RUST_LOG=spec` writes for async-nats's debug line (a stand-in for its
    /// `attempting connection` with the password), lapin's warning of a returned message
    /// (with a stand-in payload), another lapin warning, and one of ours.
    fn logged(spec: &str) -> String {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let writer = move || Sink(Arc::clone(&sink));
        let subscriber =
            tracing_subscriber::registry().with(super::layer(Some(spec), writer, false));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "async_nats::connector", server = "nats://u:PASSWORD@h", "attempting connection");
            tracing::info!(target: "async_nats", "connected");
            tracing::warn!(target: "lapin::returned_messages", message = "[80, 65, 89]", "Server returned us a message");
            tracing::warn!(target: "lapin::channel", "lapin's own warning");
            tracing::debug!(target: "oncebox::consume", "ours");
        });
        let bytes = buf.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The cap does not loosen the process's level: with `RUST_LOG=info` nothing past info
    /// is built at all.
    #[test]
    fn the_log_level_is_rust_logs() {
        use tracing_subscriber::Layer as _;
        for (spec, level) in [("info", LevelFilter::INFO), ("warn", LevelFilter::WARN)] {
            let layer =
                super::layer::<tracing_subscriber::Registry, _>(Some(spec), std::io::sink, false);
            assert_eq!(layer.max_level_hint(), Some(level), "RUST_LOG={spec}");
        }
    }

    #[test]
    fn capped_targets_stay_at_their_level_unless_rust_log_names_them() {
        for spec in [
            "debug",
            "trace",
            "async=debug,oncebox=debug",
            "oncebox=debug,debug",
            "debug,my_async_nats_glue=info",
            "debug,oncebox[async_nats]=debug",
            // Another module of it named: that one's lines, not the connector's.
            "debug,async_nats::jetstream=debug",
            "trace,async_nats::connector::other=trace",
        ] {
            let log = logged(spec);
            assert!(!log.contains("PASSWORD"), "RUST_LOG={spec}: {log}");
            assert!(!log.contains("[80, 65, 89]"), "RUST_LOG={spec}: {log}");
            assert!(log.contains("connected"), "RUST_LOG={spec}: {log}");
            assert!(log.contains("ours"), "RUST_LOG={spec}: {log}");
        }
        // Only lapin's returned messages are capped, not its other warnings.
        for spec in ["info", "debug"] {
            let log = logged(spec);
            assert!(
                log.contains("lapin's own warning"),
                "RUST_LOG={spec}: {log}"
            );
            assert!(!log.contains("[80, 65, 89]"), "RUST_LOG={spec}: {log}");
        }
        // Not made more verbose than asked either.
        let log = logged("warn");
        assert!(!log.contains("connected") && !log.contains("ours"), "{log}");
        // Named, it is the user's choice.
        for spec in ["debug,async_nats=debug", "info,async_nats::connector=debug"] {
            let log = logged(spec);
            assert!(log.contains("PASSWORD"), "RUST_LOG={spec}: {log}");
        }
        let log = logged("info,lapin::returned_messages=warn");
        assert!(log.contains("[80, 65, 89]"), "{log}");
    }
}
