//! A key held open on a real server: a first delivery through `process` whose handler keeps
//! its transaction (and the key's uncommitted row) open until the test lets it go, or makes it
//! fail, and what PostgreSQL says about the sessions waiting on it.

use std::time::Duration;

use oncebox_core::{Event, ProcessError, Processed, Response};
use oncebox_postgres::sqlx::{self, PgConnection};
use oncebox_postgres::{HandlerError, Inbox};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The first delivery of a key, holding its transaction open.
pub struct Holder {
    /// The server session that holds the transaction.
    pub pid: i32,
    /// Sends whether the handler succeeds.
    release: oneshot::Sender<bool>,
    task: JoinHandle<Result<Processed, ProcessError>>,
}

impl Holder {
    /// Starts `event` through `inbox.process`; returns once its record is inserted and its
    /// handler waits, or panics after 30 s.
    pub async fn start(inbox: &Inbox, event: Event) -> Holder {
        let (reached, at_point) = oneshot::channel::<i32>();
        let (release, released) = oneshot::channel::<bool>();
        let inbox = inbox.clone();
        let task = tokio::spawn(async move {
            inbox
                .process(event, move |tx| {
                    Box::pin(async move {
                        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(tx.conn())
                            .await?;
                        let _ = reached.send(pid);
                        if released.await == Ok(false) {
                            return Err(HandlerError::failed("the holder was told to fail"));
                        }
                        Ok(Response::completed("accepted"))
                    })
                })
                .await
        });
        let pid = tokio::time::timeout(Duration::from_secs(30), at_point)
            .await
            .expect("the holder inserted its record in time")
            .expect("the holder's handler ran");
        Holder { pid, release, task }
    }

    /// Whether the holder's `process` has returned (it must not before its release).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Lets the handler return and the transaction commit; the holder's answer.
    pub async fn release(self) -> Result<Processed, ProcessError> {
        self.release.send(true).expect("the holder still waits");
        self.task.await.expect("holder task")
    }

    /// Makes the handler fail, so its transaction rolls back and the key is free; the
    /// holder's answer.
    pub async fn fail(self) -> Result<Processed, ProcessError> {
        self.release.send(false).expect("the holder still waits");
        self.task.await.expect("holder task")
    }
}

/// Server sessions waiting on a lock that session `pid` holds.
pub async fn blocked_by(conn: &mut PgConnection, pid: i32) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
    )
    .bind(pid)
    .fetch_one(conn)
    .await
    .expect("lock waits")
}
