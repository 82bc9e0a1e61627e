//! NATS subject matching (`*` one token, a final `>` one or more), which the client does not
//! offer: enough to tell whether a stream or a filter catches the quarantine subject.

/// Whether `pattern` (a stream's subject or a consumer's filter, wildcards allowed) matches
/// `subject`, a literal subject as published.
///
/// A `>` that is not the last token is not valid NATS; it is taken as matching, because the
/// only question asked here is whether a quarantined copy could come back, and a wrong "yes"
/// refuses a setup while a wrong "no" loops forever.
pub(crate) fn matches(pattern: &str, subject: &str) -> bool {
    let (mut want, mut got) = (pattern.split('.'), subject.split('.'));
    loop {
        match (want.next(), got.next()) {
            (None, None) | (Some(">"), Some(_)) => return true,
            (Some(w), Some(g)) if w == "*" || w == g => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn wildcards_match_as_nats_does() {
        for (pattern, subject) in [
            ("a.b.c", "a.b.c"),
            ("a.*.c", "a.b.c"),
            ("a.>", "a.b"),
            ("a.>", "a.b.c"),
            (">", "a"),
            ("*", "a"),
            ("*.*", "a.b"),
        ] {
            assert!(
                matches(pattern, subject),
                "{pattern} should match {subject}"
            );
        }
        for (pattern, subject) in [
            ("a.b.c", "a.b"),
            ("a.b", "a.b.c"),
            ("a.>", "a"),
            ("a.*", "a.b.c"),
            ("*", "a.b"),
            ("a.b.c", "a.b.d"),
            ("", "a"),
            ("ab", "a"),
        ] {
            assert!(
                !matches(pattern, subject),
                "{pattern} should not match {subject}"
            );
        }
    }
}
