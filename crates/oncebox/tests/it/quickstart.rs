//! The README's first command: `oncebox serve` with no configuration at all, and the example
//! request it prints, sent exactly as printed; and the configuration examples of the README
//! and docs, pasted into one file as a reader combines them, passing `check`.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use crate::support::{Server, oncebox, text};

/// Splits a printed shell command into words: single quotes group, double quotes group and
/// fill in `$NAME` from `vars`, a backslash before the line break continues the line. Anything
/// else a shell would read differently (other escapes, a variable outside double quotes) is
/// refused, so a changed example fails here instead of being half-understood.
fn words(command: &str, vars: &[(&str, &str)]) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let quoted: String = chars.by_ref().take_while(|&q| q != '\'').collect();
                word.get_or_insert_with(String::new).push_str(&quoted);
            }
            '"' => {
                let quoted: String = chars.by_ref().take_while(|&q| q != '"').collect();
                let filled = vars.iter().fold(quoted, |text, (name, value)| {
                    text.replace(&format!("${name}"), value)
                });
                assert!(
                    !filled.contains(['$', '\\', '`']),
                    "{filled:?} is not read here"
                );
                word.get_or_insert_with(String::new).push_str(&filled);
            }
            '\\' if chars.peek() == Some(&'\n') => {
                chars.next();
            }
            '\\' | '$' | '`' => {
                panic!("the example uses {c:?}, which this test does not read")
            }
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// `oncebox serve` as a new user runs it in `dir`, with no configuration, on any free port
/// instead of 8080; its stdout piped.
fn zero_config(dir: &std::path::Path) -> Command {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_oncebox"));
    serve
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .stdout(Stdio::piped());
    serve
}

/// A request as a `curl` command line states it.
#[derive(Debug, Default)]
struct Curl {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: String,
}

fn curl(command: &str, vars: &[(&str, &str)]) -> Curl {
    let words = words(command, vars);
    assert_eq!(words.first().map(String::as_str), Some("curl"), "{command}");
    let mut request = Curl {
        method: "GET".into(),
        ..Curl::default()
    };
    let mut args = words[1..].iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().cloned().expect("a flag's value");
        match arg.as_str() {
            "-i" | "-s" => {}
            "-X" => request.method = value(),
            "-H" => {
                let header = value();
                let (name, v) = header.split_once(':').expect("name: value");
                request.headers.push((name.trim().into(), v.trim().into()));
            }
            "-d" => request.body = value(),
            url if url.starts_with("http://") => request.url = url.into(),
            other => panic!("the example uses {other:?}, which this test does not read"),
        }
    }
    request
}

#[tokio::test]
async fn serve_with_no_configuration_prints_a_request_that_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = zero_config(dir.path());
    let mut child = serve
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let command = loop {
        let line = lines.next().expect("the example request").unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.strip_prefix("try:") {
            let mut command = rest.trim().to_owned();
            while command.ends_with('\\') {
                command.push('\n');
                command.push_str(&lines.next().expect("continued line").unwrap());
            }
            break command;
        }
    };
    assert!(
        printed.starts_with("oncebox listening on http://127.0.0.1:")
            && printed.contains("oncebox.db"),
        "{printed}"
    );
    std::thread::spawn(move || lines.for_each(drop));

    let example = curl(&command, &[]);
    assert_eq!(example.method, "POST", "{command}");
    let client = reqwest::Client::new();
    let send = || {
        let mut request = client.post(&example.url).body(example.body.clone());
        for (name, value) in &example.headers {
            request = request.header(name, value);
        }
        request.send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 202);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.bytes().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.unwrap(), first_body);

    // SIGTERM: a clean stop, then what it logged.
    let mut stderr = child.stderr.take().unwrap();
    Server(child, example.url.clone(), None).stop();
    let mut logged = String::new();
    stderr.read_to_string(&mut logged).unwrap();
    assert_eq!(
        logged.matches("no sources configured").count(),
        1,
        "the zero-config warning, once: {logged}"
    );
    assert!(
        !logged.contains('\x1b'),
        "no terminal colour codes in a log that is not a terminal: {logged:?}"
    );

    // Stored once, in ./oncebox.db of the directory it ran in.
    let events = oncebox(dir.path(), &["events", "--output", "json"]);
    assert!(events.status.success(), "{}", text(&events));
    let listed: serde_json::Value = serde_json::from_slice(&events.stdout).unwrap();
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["event_id"], "evt_curl_1");
}

/// With an admin token in the environment (still no configuration file), the admin API's
/// example carries it, as the shell fills it in; the value itself is never printed.
#[tokio::test]
async fn with_an_admin_token_the_printed_admin_request_is_let_in() {
    let token = "0f".repeat(32);
    let dir = tempfile::tempdir().unwrap();
    let mut serve = zero_config(dir.path());
    let mut child = serve
        .env("ONCEBOX_ADMIN_TOKEN", &token)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let command = loop {
        let line = lines.next().expect("the admin API's example").unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.strip_prefix("events:") {
            break rest.split("   (").next().unwrap_or_default().to_owned();
        }
    };
    let server = Server(child, String::new(), None);
    assert!(!printed.contains(&token), "{printed}");
    let example = curl(&command, &[("ONCEBOX_ADMIN_TOKEN", &token)]);
    let mut request = reqwest::Client::new().get(&example.url);
    for (name, value) in &example.headers {
        request = request.header(name, value);
    }
    let answer = request.send().await.unwrap();
    assert_eq!(answer.status(), 200, "{command}");
    // Without the header the admin API refuses: the example's header is what let it in.
    let bare = reqwest::get(&example.url).await.unwrap();
    assert_eq!(bare.status(), 401);
    drop(server);
}

/// Each document's whole-table ```toml examples (not the lines shown to put into a table),
/// pasted into one `oncebox.toml`, pass `check`: the README's route once signed with its own
/// source's key, which `check` refuses.
#[test]
fn the_documents_configuration_examples_pass_check_together() {
    let documents = [
        ("README.md", include_str!("../../../../README.md")),
        ("docs/github.md", include_str!("../../../../docs/github.md")),
        (
            "docs/library.md",
            include_str!("../../../../docs/library.md"),
        ),
        (
            "docs/standard-webhooks.md",
            include_str!("../../../../docs/standard-webhooks.md"),
        ),
        ("docs/stripe.md", include_str!("../../../../docs/stripe.md")),
    ];
    // The variables the examples name, each a key of its own.
    let secrets = [
        ("STRIPE_WEBHOOK_SECRET", "whsec_stripe-test-key"),
        ("GITHUB_WEBHOOK_SECRET", "github-test-key"),
        (
            "SHOP_WEBHOOK_SECRET",
            "whsec_Wm9JjiPDd5fcsH+Gt4qvU/uyQoaWDmhs",
        ),
    ];
    for (name, document) in documents {
        let mut config = String::new();
        for block in document.split("```toml\n").skip(1) {
            let block = block.split("```").next().unwrap();
            let first = block.trim_start();
            if first.starts_with('[') || first.starts_with("listen") {
                config.push_str(block);
                config.push('\n');
            }
        }
        assert!(config.contains('['), "{name}: no example found");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oncebox.toml"), &config).unwrap();
        let out = crate::support::oncebox_with_env(dir.path(), &secrets, &["check"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}:\n{config}\n{}",
            text(&out)
        );
    }
}
