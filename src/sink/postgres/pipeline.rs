//! Sending a whole transaction in one round trip.
//!
//! tokio-postgres writes a request to the connection as soon as its future is first polled,
//! and the server answers requests in order, so `BEGIN`, every statement, the checkpoint
//! upsert and `COMMIT` can all be in flight at once
//! (<https://docs.rs/tokio-postgres/0.7/tokio_postgres/#pipelining>). Two things make that
//! safe here:
//!
//! - Order. The requests must reach the server in exactly the order given, or a statement
//!   could run outside the transaction. [`run`] starts the futures strictly one after another
//!   in one pass, rather than relying on a combinator's polling order.
//! - Failures. A statement the *server* rejects aborts the transaction; everything after it
//!   fails with "current transaction is aborted", and `COMMIT` ends it as a rollback. But a
//!   request the *client* cannot even encode (a value with no binary form) fails before it is
//!   sent, while later requests would still go out and `COMMIT` would commit a partial batch.
//!   Such a failure can only show up on a future's first poll (a server answer cannot arrive
//!   before its request was sent), so [`run`] stops starting futures at the first one that
//!   fails there; the caller then rolls back whatever transaction is open.

use std::future::poll_fn;
use std::task::Poll;

use crate::sink::BoxFuture;

/// The outcome of each future, in order; `None` for futures never started.
pub(super) type Outcomes<E = tokio_postgres::Error> = Vec<Option<Result<(), E>>>;

/// Runs `futures` as one pipeline (see the module docs).
pub(super) async fn run<E>(futures: Vec<BoxFuture<'_, Result<(), E>>>) -> Outcomes<E> {
    let n = futures.len();
    let mut futures: Vec<Option<BoxFuture<'_, _>>> = futures.into_iter().map(Some).collect();
    let mut results: Outcomes<E> = (0..n).map(|_| None).collect();
    let mut started = 0;
    let mut stop_starting = false;
    poll_fn(|cx| {
        while started < n && !stop_starting {
            let i = started;
            started += 1;
            let fut = futures[i].as_mut().expect("not started yet");
            if let Poll::Ready(result) = fut.as_mut().poll(cx) {
                stop_starting = result.is_err();
                results[i] = Some(result);
                futures[i] = None;
            }
        }
        let mut pending = false;
        for i in 0..started {
            if let Some(fut) = futures[i].as_mut() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(result) => {
                        results[i] = Some(result);
                        futures[i] = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(std::mem::take(&mut results))
        }
    })
    .await
}

/// The first failure, by position: the root cause (later failures follow from it).
pub(super) fn first_error<E>(outcomes: Outcomes<E>) -> Option<(usize, E)> {
    outcomes.into_iter().enumerate().find_map(|(i, r)| match r {
        Some(Err(e)) => Some((i, e)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Records when it is first polled; fails at once (a client-side error), fails after a
    /// yield (a server's answer), or succeeds after a yield.
    fn step(
        log: &Arc<Mutex<Vec<usize>>>,
        i: usize,
        fail: Option<bool>,
    ) -> BoxFuture<'static, Result<(), usize>> {
        let log = Arc::clone(log);
        Box::pin(async move {
            log.lock().unwrap().push(i);
            if fail == Some(true) {
                return Err(i);
            }
            tokio::task::yield_now().await;
            match fail {
                Some(_) => Err(i),
                None => Ok(()),
            }
        })
    }

    #[tokio::test]
    async fn futures_start_in_order() {
        let log = Arc::new(Mutex::new(Vec::new()));
        // More than futures-util's "small" join size, where its polling order changes.
        let outcomes = run((0..40).map(|i| step(&log, i, None)).collect()).await;
        assert!(outcomes.iter().all(Option::is_some));
        assert_eq!(*log.lock().unwrap(), (0..40).collect::<Vec<_>>());
        assert!(first_error(outcomes).is_none());
    }

    #[tokio::test]
    async fn a_client_side_failure_stops_the_rest_from_starting() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let futs = (0..5)
            .map(|i| step(&log, i, (i == 2).then_some(true)))
            .collect();
        let outcomes = run(futs).await;
        assert!(outcomes.iter().any(Option::is_none));
        assert_eq!(*log.lock().unwrap(), [0, 1, 2]);
        assert!(outcomes[3].is_none() && outcomes[4].is_none());
        assert_eq!(first_error(outcomes).map(|(i, _)| i), Some(2));
    }

    #[tokio::test]
    async fn server_side_failures_let_everything_run_and_report_the_first() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let futs = (0..5)
            .map(|i| step(&log, i, (i == 1 || i == 3).then_some(false)))
            .collect();
        let outcomes = run(futs).await;
        assert!(outcomes.iter().all(Option::is_some));
        assert_eq!(first_error(outcomes), Some((1, 1)));
    }
}
