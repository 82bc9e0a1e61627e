//! The commands' standard output, for which a reader that went away (`oncebox send … | head
//! -0`) ends nothing: what is written after is dropped, and the command still returns its
//! verdict. Ended by the write's `BrokenPipe`, a refused `send`, a failing `bench` invariant
//! or a `redeliver` with nothing to do exited 0.

use std::io::{self, ErrorKind, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first write to standard output through [`stdout`].
static WROTE: AtomicBool = AtomicBool::new(false);

/// Whether the command wrote anything to standard output (a document, even a partial one).
pub fn wrote() -> bool {
    WROTE.load(Ordering::Relaxed)
}

/// Standard output, locked; writes after the reader closed its end succeed, unseen.
pub fn stdout() -> Out<StdoutLock<'static>> {
    Out {
        inner: io::stdout().lock(),
        closed: false,
    }
}

/// A writer that drops what is written once its reader is gone.
pub struct Out<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> Out<W> {
    /// `op` on the writer while its reader is there; `dropped` once it went away.
    fn unless_closed<T>(
        &mut self,
        dropped: T,
        op: impl FnOnce(&mut W) -> io::Result<T>,
    ) -> io::Result<T> {
        if self.closed {
            return Ok(dropped);
        }
        match op(&mut self.inner) {
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(dropped)
            }
            other => other,
        }
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !buf.is_empty() {
            WROTE.store(true, Ordering::Relaxed);
        }
        self.unless_closed(buf.len(), |w| w.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.unless_closed((), Write::flush)
    }
}

/// Free text (an operator's note, an attempt's error, a stored response body) for one line of
/// a text listing: control characters escaped (`\n`, `\u{1b}`), so a note holding a line
/// break cannot split its row or fake the `more: --after N` line that scripts page by, and
/// no escape sequence reaches the terminal. JSON output escapes them itself.
pub fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_text_is_kept_to_one_line() {
        assert_eq!(
            one_line("x\nmore: --after 9\r\t\u{1b}[2Jé"),
            "x\\nmore: --after 9\\r\\t\\u{1b}[2Jé"
        );
        assert_eq!(one_line("answered 503"), "answered 503");
    }

    /// A writer whose reader is gone.
    struct Gone;

    impl Write for Gone {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_closed_reader_ends_nothing_and_other_errors_still_tell() {
        let mut out = Out {
            inner: Gone,
            closed: false,
        };
        assert!(writeln!(out, "422 Unprocessable Entity").is_ok());
        assert!(out.flush().is_ok());
        let mut full = Out {
            inner: io::Cursor::new([0u8; 2]),
            closed: false,
        };
        assert!(
            write!(full, "abc").is_err(),
            "a full buffer is no closed reader"
        );
    }
}
