//! The two-phase form of DESIGN §8 (`begin`, then `complete`, `release` or `uncertain`) as one
//! trait, so one suite ([`crate::suite::leasing`]) runs against every store that offers it:
//! SQLite and PostgreSQL through their [`Backend`], and Redis, which has only this form.

use std::future::Future;
use std::time::Duration;

use oncebox_core::{Begun, Event, Key, Lease, LeaseError, ManualClock, ProcessError, Response};

use crate::{Backend, EPOCH};

/// A store of fenced leases.
pub trait Leasing: Send + Sync + Sized + 'static {
    /// A new, empty store.
    fn fresh() -> impl Future<Output = Self> + Send;
    /// The same storage through a new handle: a restarted process, or another node.
    fn restart(self) -> impl Future<Output = Self> + Send;
    /// The same storage through a second handle while this one stays open: another process
    /// or node.
    fn another(&self) -> impl Future<Output = Self> + Send;
    fn begin(
        &self,
        event: &Event,
        ttl: Duration,
    ) -> impl Future<Output = Result<Begun, ProcessError>> + Send;
    fn complete(
        &self,
        lease: &Lease,
        response: &Response,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
    fn uncertain(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// Settles an uncertain key: `Some(response)` completed, `None` released. False when the key
    /// was not uncertain.
    fn resolve(&self, key: &Key, completed: Option<Response>) -> impl Future<Output = bool> + Send;
    /// Lets every lease taken so far with `ttl` run out, as for a holder paused past it: the
    /// clock moves on (SQL stores), or each lease's end is moved into the past on the store's
    /// own clock (Redis). The ended leases' records stay, as after any lease's end.
    fn lapse(&self, ttl: Duration) -> impl Future<Output = ()> + Send;
    /// Whether the storage is there ([`crate::service_url`] for an outside service).
    fn available() -> bool {
        true
    }
}

/// A [`Backend`]'s two-phase form, on a clock the suite moves.
#[derive(Clone, Debug)]
pub struct SqlLeases<B> {
    backend: B,
    clock: ManualClock,
}

impl<B: Backend> Leasing for SqlLeases<B> {
    async fn fresh() -> Self {
        let clock = ManualClock::new(EPOCH);
        SqlLeases {
            backend: B::fresh(clock.clone()).await,
            clock,
        }
    }

    async fn restart(self) -> Self {
        SqlLeases {
            backend: self.backend.reopen().await,
            clock: self.clock,
        }
    }

    async fn another(&self) -> Self {
        SqlLeases {
            backend: self.backend.another().await,
            clock: self.clock.clone(),
        }
    }

    fn begin(
        &self,
        event: &Event,
        ttl: Duration,
    ) -> impl Future<Output = Result<Begun, ProcessError>> + Send {
        self.backend.begin(event.clone(), ttl)
    }

    fn complete(
        &self,
        lease: &Lease,
        response: &Response,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        self.backend.complete(lease, response.clone())
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send {
        self.backend.release(lease)
    }

    fn uncertain(&self, lease: &Lease) -> impl Future<Output = Result<(), LeaseError>> + Send {
        self.backend.uncertain(lease)
    }

    fn resolve(&self, key: &Key, completed: Option<Response>) -> impl Future<Output = bool> + Send {
        self.backend.resolve(key, completed)
    }

    async fn lapse(&self, ttl: Duration) {
        self.clock.advance(ttl);
    }

    fn available() -> bool {
        B::available()
    }
}

/// Instantiates the two-phase suite for a [`Leasing`] type: one `#[test]` per behaviour.
/// [`crate::conformance!`] includes it for every [`Backend`].
#[macro_export]
macro_rules! lease_conformance {
    ($leases:ty) => {
        $crate::lease_conformance!(@tests $leases;
            lease_blocks_others_until_completed_then_replays_the_first_response,
            a_completion_repeated_by_its_holder_is_ok_and_keeps_the_first_response,
            another_payload_is_a_conflict_while_leased_and_when_done,
            expired_lease_is_taken_over_and_old_holder_is_fenced,
            a_lapsed_holder_parks_the_key_while_no_one_took_it_over,
            released_key_is_free_again_and_the_old_token_is_fenced,
            a_lease_under_a_millisecond_is_refused_and_takes_nothing,
            tokens_keep_growing_across_a_restart,
            a_second_handle_takes_over_with_a_higher_token_and_fences_the_first,
            uncertain_key_is_neither_leased_nor_duplicate_until_resolved,
        );
    };
    (@tests $leases:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if <$leases as $crate::leasing::Leasing>::available() {
                    $crate::run($crate::suite::leasing::$name::<$leases>());
                }
            }
        )*
    };
}
