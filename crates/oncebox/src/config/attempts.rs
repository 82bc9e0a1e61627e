//! A route whose attempts run out long before its `max_age`, warned of.

use oncebox_core::route::Route;

/// Warns of each route whose `max_attempts` are spent before its `max_age` could end the
/// retries: their waits, each at most its ceiling, add up to less than the age. A count of 15
/// with a backoff from 1 s to 1 h is spent within 3 hours at most (1.6 on average), and a
/// receiver down for an afternoon then loses its deliveries to the count, whatever the age
/// says. Left out, `max_attempts` is as many as the age needs.
pub(super) fn warn(routes: &[Route], warnings: &mut Vec<String>) {
    for r in routes {
        let p = &r.retry;
        let span = p.backoff.span(p.max_attempts.saturating_sub(1));
        if span < p.max_age && p.max_attempts >= oncebox_core::delivery::MOST_ATTEMPTS {
            warnings.push(format!(
                "routes.{}.backoff.cap: even {} attempts are spent within {} at most, before \
                 max_age ({}): raise the cap, or shorten max_age",
                r.name,
                p.max_attempts,
                humantime::format_duration(span),
                humantime::format_duration(p.max_age),
            ));
        } else if span < p.max_age {
            warnings.push(format!(
                "routes.{}.max_attempts: {} attempts are spent within {} at most (about half \
                 of that on average, full jitter), long before max_age ({}): a receiver down for \
                 longer loses its deliveries to the count; leave max_attempts out to retry until \
                 max_age",
                r.name,
                p.max_attempts,
                humantime::format_duration(span),
                humantime::format_duration(p.max_age),
            ));
        }
    }
}
