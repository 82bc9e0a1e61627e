//! `oncebox --help` and each command's: examples at the end, the exit codes, and examples that
//! work as written.

use std::process::Command;

use crate::support::{oncebox, text};

const COMMANDS: [&str; 13] = [
    "serve",
    "consume",
    "relay",
    "deliveries",
    "redeliver",
    "check",
    "send",
    "bench",
    "events",
    "inspect",
    "stats",
    "purge",
    "migrate",
];

#[test]
fn help_ends_with_examples_and_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let top = oncebox(dir.path(), &["--help"]);
    assert!(text(&top).contains("4  unavailable"), "{}", text(&top));
    for command in COMMANDS {
        let out = oncebox(dir.path(), &[command, "--help"]);
        assert!(out.status.success(), "{command}: {}", text(&out));
        assert!(
            text(&out).contains("Examples:"),
            "{command}: {}",
            text(&out)
        );
    }
}

/// The exit codes `oncebox --help` lists are the README's table, row for row (the README
/// quotes command and flag names, the help does not).
#[test]
fn the_exit_codes_of_help_are_the_readmes() {
    let dir = tempfile::tempdir().unwrap();
    let help = text(&oncebox(dir.path(), &["--help"]));
    let table = help.split_once("Exit codes:\n").expect("the table").1;
    let mut listed = Vec::new();
    for line in table.lines() {
        match line.trim_start().split_once("  ") {
            Some((code, meaning)) if code.parse::<u8>().is_ok() => {
                listed.push(format!("{code} {meaning}"));
            }
            _ => {
                let last = listed.last_mut().expect("a row before its continuation");
                last.push(' ');
                last.push_str(line.trim());
            }
        }
    }
    let readme: Vec<String> = include_str!("../../../../README.md")
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|row| {
            let (code, meaning) = row.split_once(" | ")?;
            code.parse::<u8>().ok()?;
            let meaning = meaning.trim_end_matches(" |").replace('`', "");
            Some(format!("{code} {meaning}"))
        })
        .collect();
    assert_eq!(listed, readme);
}

/// An admin token in an example is one the configuration accepts (it refuses short ones), so
/// the example runs when copied.
#[test]
fn help_examples_use_admin_tokens_the_configuration_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let mut tokens = Vec::new();
    for command in COMMANDS {
        let help = text(&oncebox(dir.path(), &[command, "--help"]));
        let examples = help.split_once("Examples:").map_or("", |(_, e)| e);
        for word in examples.split_whitespace() {
            if let Some(token) = word.strip_prefix("ONCEBOX_ADMIN_TOKEN=") {
                // `$(openssl rand -hex 32)`: what the shell gives, 64 hexadecimal digits.
                let generated = token.starts_with("$(openssl");
                tokens.push(if generated {
                    "0f".repeat(32)
                } else {
                    token.to_owned()
                });
            }
        }
        let words: Vec<&str> = examples.split_whitespace().collect();
        for pair in words.windows(2) {
            if pair[0] == "--admin-token" {
                tokens.push(pair[1].to_owned());
            }
        }
    }
    assert!(!tokens.is_empty(), "no example sets an admin token");
    for token in tokens {
        let out = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .arg("check")
            .current_dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_DATABASE")
            .env("ONCEBOX_ADMIN_TOKEN", &token)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{token}: {}", text(&out));
    }
}
