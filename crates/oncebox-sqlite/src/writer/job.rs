//! A queued request: run inside the batch's transaction — again in a new one if another
//! request's statement made SQLite roll the first back and its code can run twice — and
//! answered once, after the batch's fate is known.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use oncebox_core::Unavailable;

use super::{Cx, Fatal};

/// What a request runs in the transaction.
pub(crate) trait Body<T, E>: Send + 'static {
    fn call(&mut self, cx: &mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal>;

    /// Whether it may run again in a new transaction once it ran: the transaction it ran in
    /// was rolled back by another request, and what it did went with it.
    fn again(&self) -> bool;
}

/// Code that runs once: a caller's closure, which may move what it captured.
pub(crate) struct Once<F>(Option<F>);

/// Bounded here, so that a closure given directly is typed for every `Cx` lifetime.
pub(crate) fn once<T, E, F>(f: F) -> Once<F>
where
    F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
{
    Once(Some(f))
}

impl<T, E, F> Body<T, E> for Once<F>
where
    F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
{
    fn call(&mut self, cx: &mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> {
        match self.0.take() {
            Some(f) => f(cx),
            None => Err(Fatal(Unavailable::Storage(RAN_TWICE.into()))),
        }
    }

    fn again(&self) -> bool {
        false
    }
}

/// Code that only reads what it was given (oncebox's own requests, a handler that is `Fn`):
/// running it again in a new transaction does what the first run would have.
pub(crate) struct Again<F>(F);

/// Bounded here, so that a closure given directly is typed for every `Cx` lifetime.
pub(crate) fn again<T, E, F>(f: F) -> Again<F>
where
    F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
{
    Again(f)
}

impl<T, E, F> Body<T, E> for Again<F>
where
    F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
{
    fn call(&mut self, cx: &mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> {
        (self.0)(cx)
    }

    fn again(&self) -> bool {
        true
    }
}

pub(crate) const RAN_TWICE: &str = "a request's code was asked to run a second time";

/// A request as the writer holds it: its body, where its answer goes, and the answer its last
/// run gave.
trait Request: Send {
    fn run(&mut self, cx: &mut Cx<'_, '_>) -> Result<(), Fatal>;
    fn again(&self) -> bool;
    /// Sends the kept answer, or `failed` in its place.
    fn answer(self: Box<Self>, failed: Option<Unavailable>);
}

struct Pending<B, R, T, E> {
    body: B,
    reply: R,
    answer: Option<Result<T, E>>,
}

impl<B, R, T, E> Request for Pending<B, R, T, E>
where
    B: Body<T, E>,
    R: FnOnce(Result<T, E>) + Send + 'static,
    T: Send + 'static,
    E: From<Unavailable> + Send + 'static,
{
    fn run(&mut self, cx: &mut Cx<'_, '_>) -> Result<(), Fatal> {
        self.answer = None;
        self.answer = Some(self.body.call(cx)?);
        Ok(())
    }

    fn again(&self) -> bool {
        self.body.again()
    }

    fn answer(self: Box<Self>, failed: Option<Unavailable>) {
        let Pending {
            body,
            reply,
            answer,
        } = *self;
        // What the body shares with its caller is let go before the caller wakes (store.rs
        // takes its event back whole). Dropped here, on the writer, as are an answer the
        // batch's failure replaced and one its caller no longer waits for: values of the
        // caller's own (a handler never run, its captures), whose `Drop` may panic. Caught, that
        // panic ends neither the writer nor the answers of the batch-mates still to be told
        // (uncaught, they read `Closed`, and a reader stood in with their own commit:
        // `Duplicate` for a handler that ran). A caller whose answer was lost so reads it as
        // unknown (`inbox/submit.rs`).
        let _ = catch_unwind(AssertUnwindSafe(move || drop(body)));
        let answer = catch_unwind(AssertUnwindSafe(move || match (failed, answer) {
            (None, Some(answer)) => answer,
            (Some(why), replaced) => {
                drop(replaced);
                Err(E::from(why))
            }
            (None, None) => Err(E::from(Unavailable::Storage(
                "the request never ran".into(),
            ))),
        }));
        if let Ok(answer) = answer {
            let _ = catch_unwind(AssertUnwindSafe(move || reply(answer)));
        }
    }
}

/// One queued request.
pub(crate) struct Job {
    deadline: Instant,
    request: Box<dyn Request>,
}

impl Job {
    /// `reply` hands the answer to the caller (a channel's send), once the batch committed, or
    /// `Unavailable` in its place when it did not.
    pub fn new<T, E, B, R>(deadline: Instant, reply: R, body: B) -> Job
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
        R: FnOnce(Result<T, E>) + Send + 'static,
    {
        Job {
            deadline,
            request: Box::new(Pending {
                body,
                reply,
                answer: None,
            }),
        }
    }

    pub(super) fn expired(&self) -> bool {
        self.deadline <= Instant::now()
    }

    /// Runs it in the open transaction; its answer is kept until [`Job::answer`].
    pub(super) fn run(&mut self, cx: &mut Cx<'_, '_>) -> Result<(), Fatal> {
        self.request.run(cx)
    }

    pub(super) fn again(&self) -> bool {
        self.request.again()
    }

    /// Sends its answer: the kept one, or `failed`.
    pub(super) fn answer(self, failed: Option<Unavailable>) {
        self.request.answer(failed);
    }

    pub(super) fn refuse(self, why: Unavailable) {
        self.answer(Some(why));
    }
}
