//! The `oncebox` binary: command line, configuration, and the wiring of the backends.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use oncebox_core::Key;
use oncebox_core::store::EventFilter;

mod argv;
mod bench;
mod cli;
mod client;
mod config;
mod consume;
mod deliveries;
mod events;
mod exit;
mod logging;
mod out;
mod progress;
mod redeliver;
mod send;
mod serve;
mod store;

use cli::{Cli, Command, Output};
use exit::{Code, WithCode};
use store::Store;

/// mimalloc rather than the system allocator: the gateway's request path allocates many small
/// short-lived values (headers, JSON, answers); with glibc's allocator they cost about a
/// quarter of that path's instructions, measured under callgrind with the HTTP benchmark.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    logging::init();
    // One rustls provider for the whole process, ring, before any TLS client is built: a
    // verifier built without a provider of its own (sqlx's for `sslmode=verify-ca`) asks for
    // the default, and rustls panics when it cannot tell which one that is.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // clap prints usage errors itself and exits with 2 (exit::Code::Usage).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refused_by_clap(&e),
    };
    let json = cli.command.json_output();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            complain(format_args!("cannot start the runtime: {e}"));
            return Code::Failure.into();
        }
    };
    let verdict = runtime.block_on(run(cli));
    // A store's open a stop left behind (`Stop::before`) may still wait on a busy file on a
    // blocking thread, which dropping the runtime would wait for: everything the command
    // awaited is done, so what is left is not waited for long.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match verdict {
        Ok(()) => Code::Ok.into(),
        // A write to a closed pipe that did not go through `out` (which drops such writes, so
        // that the command still returns its verdict): the reader took what it wanted.
        Err(e) if closed_pipe(&e) => Code::Ok.into(),
        Err(e) => {
            let (report, code) = (exit::report(&e), exit::classify(&e));
            complain(format_args!("{report}"));
            // A script that asked for JSON reads one document on every path: with nothing on
            // stdout, `… | jq .x` printed nothing and exited 0.
            if json && !out::wrote() {
                let _ = writeln!(out::stdout(), "{}", failure_doc(code, &report));
            }
            code.into()
        }
    }
}

/// Prints clap's refusal of the arguments (or the help or version asked for) and exits as clap
/// does; a refusal also gives a script that asked for `--output json` its document on stdout.
fn refused_by_clap(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    if !e.use_stderr() {
        // `--help` or `--version`: printed on stdout, exit 0.
        return Code::Ok.into();
    }
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let json = args
        .windows(2)
        .any(|w| w[0] == "--output" && w[1] == "json")
        || args.iter().any(|a| a == "--output=json");
    if json {
        let error = e.kind().as_str().unwrap_or("invalid arguments");
        let _ = writeln!(out::stdout(), "{}", failure_doc(Code::Usage, error));
    }
    Code::Usage.into()
}

/// The one document a command asked for `--output json` prints when it fails.
fn failure_doc(code: Code, error: &str) -> serde_json::Value {
    serde_json::json!({ "ok": false, "code": code as i32, "error": error })
}

/// Whether the command ended on a write to a closed pipe: an IO error of its own, the one a
/// `writeln!` to stdout gives, not one inside another (a request whose connection broke is a
/// failure to report).
fn closed_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Prints the error that ends the command. A stderr nobody reads (a closed pipe) loses the
/// message, not the exit code: `eprintln!` would panic and exit 101 instead.
fn complain(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "error: {message}");
}

async fn run(cli: Cli) -> Result<()> {
    let (listen, admin_token) = match &cli.command {
        Command::Serve {
            listen,
            admin_token,
            ..
        }
        | Command::Check {
            listen,
            admin_token,
            ..
        } => (*listen, admin_token.clone()),
        _ => (None, None),
    };
    let overrides = config::Overrides {
        config: cli.config,
        listen,
        database: cli.database,
        admin_token,
        secrets: secrets_needed(&cli.command),
    };
    let mut out = crate::out::stdout();
    let exposed = argv::exposed(std::env::args_os());
    let mut settings = match config::load(&overrides) {
        Ok(settings) => settings,
        Err(e) => {
            // Said whatever else is wrong: a URL refused as malformed is still in `ps`.
            for warning in &exposed {
                let _ = writeln!(std::io::stderr(), "warning: {warning}");
            }
            // A script asking `check` for JSON gets a verdict on stdout as well.
            if let Command::Check { output: o, .. } = &cli.command
                && o.output == Output::Json
            {
                writeln!(out, "{}", failure_doc(Code::Usage, &format!("{e:#}")))?;
            }
            return Err(exit::coded(Code::Usage, e));
        }
    };
    // Said where the command's other warnings are: `serve` and `consume` log them, `check`
    // prints them.
    for warning in exposed {
        match cli.command {
            Command::Serve { .. } | Command::Consume { .. } | Command::Check { .. } => {
                settings.warnings.push(warning);
            }
            _ => {
                let _ = writeln!(std::io::stderr(), "warning: {warning}");
            }
        }
    }
    match cli.command {
        Command::Serve { no_relay, .. } => {
            drop(out);
            serve::run(settings, !no_relay).await?;
        }
        Command::Relay => {
            drop(out);
            serve::relay_only(settings).await?;
        }
        Command::Consume { amqp, nats } => {
            drop(out);
            consume::run(settings, amqp, nats).await?;
        }
        Command::Deliveries { action } => {
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            deliveries::run(&mut out, &store, action).await?;
        }
        Command::Redeliver(args) => {
            args.check()?;
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            redeliver::run(&mut out, &store, args).await?;
        }
        Command::Check { output: o, .. } => match o.output {
            Output::Json => writeln!(out, "{}", config::describe_json(&settings))?,
            Output::Text => {
                for w in &settings.warnings {
                    writeln!(out, "warning: {w}")?;
                }
                write!(out, "{}", config::describe(&settings))?;
                writeln!(out, "configuration ok")?;
            }
        },
        Command::Send {
            source,
            id,
            body,
            url,
        } => {
            drop(out);
            let args = send::SendArgs {
                source,
                id,
                body,
                url,
            };
            if !send::run(&settings, args).await? {
                return Err(exit::refused("the gateway did not accept the event"));
            }
        }
        Command::Bench(args) => {
            drop(out);
            if !bench::run(&settings, args).await? {
                return Err(exit::refused("the invariant check failed"));
            }
        }
        Command::Events {
            source,
            after,
            limit,
            output,
        } => {
            let filter = EventFilter {
                source: events::source(source)?,
                after,
                limit,
            };
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            events::events(&mut out, &store, filter, output.output).await?;
        }
        Command::Inspect {
            source,
            event_id,
            output,
        } => {
            let key = Key::parse(&source, &event_id).code(Code::Usage)?;
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            events::inspect(&mut out, &store, &key, output.output).await?;
        }
        Command::Stats(o) => {
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            events::stats(&mut out, &store, o.output).await?;
        }
        Command::Purge { retention, output } => {
            let retention = events::purge_retention(&settings, retention).code(Code::Usage)?;
            let store =
                Store::open_existing(&settings.database, store::Schema::AsIs, &settings.storage)
                    .await?;
            events::purge(&mut out, &store, &settings, retention, output.output).await?;
        }
        Command::Migrate => {
            // A mistyped path, or the default relative one run from another directory, creates
            // a database: said so, the deploy's log shows it.
            let created = store::sqlite_absent(&settings.database);
            Store::open_with(&settings.database, &settings.storage).await?;
            let database = store::describe(&settings.database);
            let what = if created {
                "created, schema up to date"
            } else {
                "schema up to date"
            };
            writeln!(out, "{database}: {what}")?;
        }
    }
    Ok(())
}

/// The secrets `command` uses: a relay or purge node need not be given the sources' secrets.
fn secrets_needed(command: &Command) -> config::Secrets {
    use config::Secrets;
    match command {
        Command::Send { .. } | Command::Bench(_) => Secrets::Inbound,
        // Without its relay too: the dashboard shows which routes sign.
        Command::Serve { .. } | Command::Check { .. } => Secrets::All,
        Command::Relay => Secrets::Outbound,
        Command::Consume { .. }
        | Command::Deliveries { .. }
        | Command::Redeliver(_)
        | Command::Events { .. }
        | Command::Inspect { .. }
        | Command::Stats(_)
        | Command::Purge { .. }
        | Command::Migrate => Secrets::Neither,
    }
}
