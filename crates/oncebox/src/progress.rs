//! Progress bars for long work, drawn on stderr only when stderr is a terminal, so piped or
//! captured output (scripts, `--output json`) never carries escape codes.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

fn target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar over `len` known steps.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), target());
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_owned());
    bar
}

/// A spinner for work whose size is not known in advance; it ticks by itself. `counted` shows
/// how many steps were made (`inc`), for work that has steps at all.
pub fn spinner(what: &str, counted: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, target());
    let template = if counted {
        "{spinner} {msg} {pos} {elapsed}"
    } else {
        "{spinner} {msg} {elapsed}"
    };
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(what.to_owned());
    if !bar.is_hidden() {
        bar.enable_steady_tick(Duration::from_millis(100));
    }
    bar
}
