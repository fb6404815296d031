//! What a running job shares with the keeper and the settler: its [`Control`], the
//! [`Ended`] guard, the keeper's messages and the settler's input. A leaf module, so
//! that the job, the keeper, the slots and the settler depend on it and not on one
//! another.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use tokio::{
    sync::{Notify, mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::context::{JobContext, LeaseDeadline};
use crate::{JobId, Lease, LeaseToken, Settle};

/// An outcome for the settler, with the guard that tells the keeper the job ended once
/// the settler is done with it (stored, given up on, or dropped in a panic).
pub(super) type Settling = (Settle, Ended);

/// What the keeper is told. Every job that gets a `Started` gets one `Ended`.
pub(super) enum Msg {
    /// A job started, claimed at `claimed_at`: beat its lease from then on every
    /// `every`; stop the job if the lease is lost, unless its outcome went to the
    /// settler already.
    Started {
        lease: Lease,
        claimed_at: Instant,
        control: Arc<Control>,
    },
    /// A job ended: its outcome was stored or given up on, or its run ended without
    /// one. Its lease needs no more beats.
    Ended(JobId, LeaseToken),
}

/// One job's state as its slot and the keeper share it.
#[derive(Default)]
pub(super) struct Control {
    /// Set once the handler's outcome is decided and on its way to the settler: the
    /// keeper no longer stops the job then.
    pub(super) handed: AtomicBool,
    /// Set when the job's run ended, whatever its end.
    pub(super) finished: AtomicBool,
    /// Set by the keeper when the lease is lost: the handler must stop.
    pub(super) stopped: AtomicBool,
    pub(super) stop: Notify,
    /// Fired whenever the handler is stopped without being waited for, for what it
    /// started outside its future ([`JobContext::stopping`]).
    pub(super) token: CancellationToken,
    /// The lease's deadline as the keeper reckons it, renewed by each beat through.
    deadline: watch::Sender<Option<LeaseDeadline>>,
    /// The handler's latest progress not yet written; the keeper takes it once a second.
    pub(super) progress: Arc<Mutex<Option<(u8, String)>>>,
}

impl Control {
    pub(super) fn handed(&self) -> bool {
        self.handed.load(Ordering::SeqCst)
    }

    pub(super) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Stops the job without an outcome: someone else owns it now. Its handler is
    /// dropped before it is polled again (or never starts): a handler that blocks its
    /// thread stops once it yields.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // A permit is kept if the job is not waiting yet.
        self.stop.notify_one();
        self.token.cancel();
    }

    /// Whether the keeper stopped the job (its lease lost or run out).
    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Sets the lease's deadline, as the keeper reckons it after a claim or a beat.
    pub(super) fn set_deadline(&self, deadline: LeaseDeadline) {
        self.deadline.send_replace(Some(deadline));
    }

    pub(super) fn context(&self) -> JobContext {
        JobContext::new(
            self.token.clone(),
            self.deadline.subscribe(),
            self.progress.clone(),
        )
    }
}

/// Tells the keeper, when dropped, that a job ended, so that it stops heartbeating the
/// lease. It lives with the job on its slot until the outcome goes to the settler,
/// then with the outcome until it is stored or given up on; a job stopped or dropped
/// (lease lost, worker dropped) or a settler that panics drops it on the way. So each
/// started job ends exactly once.
pub(super) struct Ended {
    keeper: mpsc::UnboundedSender<Msg>,
    job: JobId,
    token: LeaseToken,
}

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.keeper.send(Msg::Ended(self.job, self.token));
    }
}

impl Ended {
    pub(super) fn new(keeper: mpsc::UnboundedSender<Msg>, lease: &Lease) -> Self {
        Self {
            keeper,
            job: lease.job,
            token: lease.token,
        }
    }
}
