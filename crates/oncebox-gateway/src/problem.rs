//! The one place that maps outcomes and errors to HTTP: RFC 9457 problem documents whose `type`
//! ends with the slug DESIGN §4 names, and the status codes an outside client relies on.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncebox_core::{Invalid, ProcessError, Processed, ResponseKind};

/// Marks a replayed answer (DESIGN §4).
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// What the gateway answers, before it becomes a response; also the metrics outcome label.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    Accepted(Vec<u8>),
    Duplicate(Vec<u8>),
    Stale(Vec<u8>),
    Problem(Problem),
}

/// An RFC 9457 problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: StatusCode,
    pub slug: &'static str,
    pub title: &'static str,
    pub detail: String,
    /// Sent as `Retry-After` (seconds) on 409 and 503.
    pub retry_after: Option<Duration>,
    /// Sent as `WWW-Authenticate` on a 401 (RFC 9110 §15.5.2: a 401 names its challenge).
    pub challenge: Option<&'static str>,
}

/// The least `Retry-After` for a key parked uncertain.
pub const UNCERTAIN_RETRY_AFTER: Duration = Duration::from_secs(60);

impl Problem {
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
            challenge: None,
        }
    }

    pub fn challenge(mut self, challenge: &'static str) -> Problem {
        self.challenge = Some(challenge);
        self
    }

    pub fn retry_after(mut self, d: Duration) -> Problem {
        self.retry_after = Some(d);
        self
    }

    pub fn unavailable(detail: impl Into<String>, retry_after: Duration) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Unavailable",
            detail,
        )
        .retry_after(retry_after)
    }

    /// A store's failure, answered by its kind only: the store's own words can name hosts,
    /// ports, roles and paths (`public_detail`), so they go to the log, not to the client.
    pub fn store_unavailable(e: &oncebox_core::Unavailable, retry_after: Duration) -> Problem {
        tracing::warn!(cause = %e, "store unavailable");
        Problem::unavailable(public_detail(e), retry_after)
    }

    /// [`Problem::store_unavailable`] for an operator's action (retry, resolve, redeliver): an
    /// unconfirmed commit there has no record to answer a repeat, and a redeliver that did
    /// commit, repeated, sends the event again.
    pub fn action_unavailable(e: &oncebox_core::Unavailable, retry_after: Duration) -> Problem {
        match e {
            oncebox_core::Unavailable::CommitUnknown(_) => {
                tracing::warn!(cause = %e, "store unavailable");
                Problem::unavailable(
                    "the action's commit could not be confirmed; look at the delivery before \
                     repeating it",
                    retry_after,
                )
            }
            _ => Problem::store_unavailable(e, retry_after),
        }
    }

    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            detail,
        )
    }

    pub fn not_found(slug: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, slug, "Not found", detail)
    }

    /// A body past what its receiver takes: a source's `max_body`, a form's limit, or what
    /// the store keeps.
    pub fn body_too_large(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Body too large",
            detail,
        )
    }

    pub fn invalid(slug: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, slug, "Invalid event", detail)
    }

    /// An admin request's query or path that names nothing valid.
    pub fn invalid_request(slug: &'static str, detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, slug, "Invalid request", detail)
    }
}

impl Answer {
    /// Maps a store outcome. Only a committed record yields 2xx; every error that says nothing
    /// about the key's fate is a 503 with `Retry-After`, never a success (G3).
    pub fn from_outcome(outcome: Result<Processed, ProcessError>, retry_after: Duration) -> Answer {
        match outcome {
            Ok(Processed::Applied(r)) if r.kind == ResponseKind::Stale => Answer::Stale(r.body),
            Ok(Processed::Applied(r)) => Answer::Accepted(r.body),
            Ok(Processed::Duplicate(r)) => Answer::Duplicate(r.body),
            // The gateway's store always records a body for stale events; an empty one only if a
            // store chose not to.
            Ok(Processed::Stale) => {
                Answer::Stale(br#"{"status":"accepted","stale":true}"#.to_vec())
            }
            Ok(_) => Answer::Problem(Problem::unavailable(
                "the store gave an unexpected outcome",
                retry_after,
            )),
            // The stored payload's fingerprint stays out of the answer: anyone who can reach an
            // unsigned source could ask for it under a guessed id, and a fingerprint of a few
            // fields (an account, an amount) is a hash cheap to invert by trying values. The
            // audit record keeps both for the operator.
            Err(ProcessError::Conflict { stored: _, offered }) => Answer::Problem(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Event id reused with a different payload",
                format!(
                    "this event id was stored with another payload (this one's fingerprint \
                     {offered}); the first payload wins"
                ),
            )),
            Err(ProcessError::InProgress { retry_after: wait }) => Answer::Problem(
                Problem::new(
                    StatusCode::CONFLICT,
                    "in-progress",
                    "In progress",
                    "the event is being processed",
                )
                .retry_after(wait.max(Duration::from_secs(1))),
            ),
            // Parked until an operator settles it (`resolve`): minutes or more, not the second
            // a busy store asks for, which had a sender honouring it retry every second.
            Err(ProcessError::Uncertain) => Answer::Problem(
                Problem::new(
                    StatusCode::CONFLICT,
                    "in-progress",
                    "In progress",
                    "the event awaits reconciliation",
                )
                .retry_after(retry_after.max(UNCERTAIN_RETRY_AFTER)),
            ),
            // A source's `max_body` set past what the store keeps (with its headers).
            Err(ProcessError::Invalid(e @ Invalid::TooLarge { .. })) => {
                Answer::Problem(Problem::body_too_large(e.to_string()))
            }
            // Named as the ingress names what it checks itself (the store checks again).
            Err(ProcessError::Invalid(e)) => {
                let slug = match &e {
                    Invalid::Key(_) | Invalid::Delivery(_) => "event-id-invalid",
                    Invalid::Order(_) => "order-field-invalid",
                    _ => "invalid-json",
                };
                Answer::Problem(Problem::invalid(slug, e.to_string()))
            }
            Err(ProcessError::Unavailable(e)) => {
                Answer::Problem(Problem::unavailable(public_detail(&e), retry_after))
            }
            Err(_) => Answer::Problem(Problem::unavailable(
                "the store failed to take the event",
                retry_after,
            )),
        }
    }

    /// The metrics label of this answer: one of [`OUTCOMES`].
    pub fn outcome(&self) -> &'static str {
        match self {
            Answer::Accepted(_) => "accepted",
            Answer::Duplicate(_) => "duplicate",
            Answer::Stale(_) => "stale",
            Answer::Problem(p) => match p.status.as_u16() {
                401 | 403 => "unauthorized",
                // The sender's connection was too slow: nothing says the event was bad.
                408 => "timeout",
                409 => "in_progress",
                422 => "conflict",
                503 => "unavailable",
                _ => "invalid",
            },
        }
    }
}

/// Every value [`Answer::outcome`] gives; `meter.rs` keeps a counter for each.
pub const OUTCOMES: [&str; 9] = [
    "accepted",
    "duplicate",
    "stale",
    "unauthorized",
    "in_progress",
    "conflict",
    "unavailable",
    "timeout",
    "invalid",
];

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "type": format!("urn:oncebox:problem:{}", self.slug),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut res = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            )],
            body.to_string(),
        )
            .into_response();
        // A browser sent here (an admin URL opened in a tab) must not sniff the detail, which
        // may echo what the request said, into HTML; the dashboard's pages say the same.
        res.headers_mut().insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        if let Some(wait) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, retry_after_value(wait));
        }
        // RFC 9110 §15.5.16: a 415 for a content coding says which codings are taken.
        if self.slug == "encoding-unsupported" {
            res.headers_mut().insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        if let Some(challenge) = self.challenge {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        res
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least one (`Retry-After: 0` would
/// invite a hot retry loop).
pub(crate) fn retry_after_value(wait: Duration) -> HeaderValue {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Accepted(body) | Answer::Stale(body) => json(StatusCode::ACCEPTED, body),
            Answer::Duplicate(body) => {
                let mut res = json(StatusCode::ACCEPTED, body);
                res.headers_mut()
                    .insert(REPLAYED, HeaderValue::from_static("true"));
                res
            }
            Answer::Problem(p) => p.into_response(),
        }
    }
}

/// What a 503 tells the client of the store's trouble: its kind, never the store's own text.
/// That text can name hosts, ports, file paths and roles (`connection refused to 10.0.4.7:5432`,
/// `unable to open /var/lib/oncebox/…`), and a webhook sender shows the answer's body in its
/// own dashboard, to whoever reads it there. The text goes to the log.
pub fn public_detail(e: &oncebox_core::Unavailable) -> &'static str {
    use oncebox_core::Unavailable;
    match e {
        Unavailable::Busy => "the database is busy; try again",
        Unavailable::Deadline => "the store did not answer in time; try again",
        Unavailable::Closed => "the gateway is shutting down; try again",
        Unavailable::CommitUnknown(_) => {
            "the event's commit could not be confirmed; send it again: its record answers"
        }
        Unavailable::Storage(_) => "the storage failed; try again later",
        _ => "the store is unavailable; try again later",
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::Unavailable;

    use super::*;

    #[test]
    fn a_503_names_the_kind_of_trouble_and_never_the_stores_text() {
        let text = "connection to 10.0.4.7:5432 refused for role payments";
        for e in [
            Unavailable::Storage(text.to_owned()),
            Unavailable::CommitUnknown(text.to_owned()),
        ] {
            let Answer::Problem(p) =
                Answer::from_outcome(Err(ProcessError::Unavailable(e)), Duration::from_secs(1))
            else {
                panic!("a 503 expected");
            };
            assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(!p.detail.contains("10.0.4.7"), "{}", p.detail);
        }
    }

    #[test]
    fn a_key_parked_uncertain_asks_for_a_retry_in_a_minute_not_a_second() {
        let Answer::Problem(p) =
            Answer::from_outcome(Err(ProcessError::Uncertain), Duration::from_secs(1))
        else {
            panic!("a 409 expected");
        };
        assert_eq!((p.status, p.slug), (StatusCode::CONFLICT, "in-progress"));
        assert_eq!(p.retry_after, Some(UNCERTAIN_RETRY_AFTER));
    }
}
