//! # relayq-conformance
//!
//! The behaviour every relayq backend must have, as tests. Each rule of the SPEC
//! (`docs/SPEC.md` in the repository) is one or more plain `async fn(&Env) -> anyhow::Result<()>` cases
//! in [`cases`]; [`suite!`] stamps one `#[tokio::test]` per case for a backend.
//!
//! A backend crate runs the whole suite with a factory that returns an [`Env`], or
//! `None` to skip (see [`harness`] for servers):
//!
//! ```ignore
//! async fn env() -> Option<relayq_conformance::Env> {
//!     let url = relayq_conformance::harness::server_url(Server::Postgres).await?;
//!     let backend = PostgresBackend::connect(&url).await.unwrap();
//!     Some(Env::new(backend, move || { let url = url.clone(); async move { ... } }))
//! }
//! relayq_conformance::suite!(env);
//! ```
//!
//! Every case makes its own random queue names, so cases run in parallel and survive a
//! server left dirty by earlier runs.

pub mod cases;
pub mod harness;
pub mod model;
mod util;

use std::{future::Future, sync::Arc};

use futures::future::BoxFuture;
use relayq_core::Backend;

pub use util::{poll_until, queue_name};

/// What a case gets: a backend handle, and a way to open more independent handles to
/// the same store (separate connections, as separate processes would have).
pub struct Env {
    backend: Arc<dyn Backend>,
    connect: Connect,
}

/// Opens a further handle to the store of an [`Env`].
type Connect = Box<dyn Fn() -> BoxFuture<'static, anyhow::Result<Arc<dyn Backend>>> + Send + Sync>;

impl Env {
    /// An environment over `backend`, with `connect` opening further handles.
    pub fn new<B, F, Fut>(backend: B, connect: F) -> Self
    where
        B: Backend + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        Self {
            backend: Arc::new(backend),
            connect: Box::new(move || Box::pin(connect())),
        }
    }

    /// The main handle.
    #[must_use]
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The main handle, shared.
    #[must_use]
    pub fn shared(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// A new, independent handle to the same store.
    ///
    /// # Errors
    /// When the backend cannot connect.
    pub async fn connect(&self) -> anyhow::Result<Arc<dyn Backend>> {
        (self.connect)().await
    }
}

/// Calls `$callback! { module::case, ... }` with every case of the suite. This is the
/// one list of cases.
#[macro_export]
macro_rules! for_each_case {
    ($($callback:ident)::+ ! $( ( $($args:tt)* ) )?) => {
        $($callback)::+! { $( $($args)* ; )?
            enqueue::e1_returns_ids_in_order,
            enqueue::e1_invalid_job_stores_nothing,
            enqueue::e2_future_job_waits_for_run_at,
            enqueue::e3_dedupe_returns_existing_job,
            enqueue::e3_finished_job_frees_its_key,
            enqueue::e4_invalid_jobs_name_the_field,
            enqueue::e4_payload_limit_is_inclusive,
            batches::e4_unknown_batch_is_rejected,
            claim::c1_claim_returns_leases,
            claim::c1_claim_rejects_bad_requests,
            scenarios::c2_concurrent_claimers_take_each_job_once,
            claim::c3_claims_follow_order_key,
            claim::c4_claims_do_not_wait,
            claim::c5_expired_lease_is_taken_over,
            claim::c5_expired_without_attempts_dies_at_claim,
            claim::c5_maintain_requeues_then_kills,
            claim::c6_max_running_caps_claims,
            claim::c6_expired_lease_frees_its_slot,
            claim::c6_pause_stops_claims_until_resume,
            scenarios::c6_max_running_holds_under_load,
            lease::l1_complete_twice_is_stale,
            lease::l1_wrong_token_changes_nothing,
            lease::l1_lease_of_another_queue_changes_nothing,
            lease::l1_expired_lease_no_longer_holds,
            lease::l2_fail_with_attempts_left_retries,
            lease::l2_default_backoff_is_about_one_second,
            lease::l2_permanent_failure_is_dead,
            lease::l3_heartbeat_keeps_lease,
            lease::l3_heartbeat_rejects_stale_and_bad_extend,
            lease::l4_release_does_not_count,
            lease::l5_attempt_log_records_attempts,
            lease::l5_attempt_log_keeps_output,
            lease::l5_running_lists_holders,
            lease::l6_settle_many_judges_each_lease,
            lease::l6_completions_alone_judge_each_lease,
            lease::l6_lease_repeated_in_one_call_settles_once,
            lease::l6_completion_repeated_in_a_call_of_completions,
            lease::l6_a_full_call_settles_every_lease,
            lease::l6_rejected_settle_call_settles_nothing,
            scenarios::g1_groups_exclusive_and_ordered_under_load,
            groups::g2_retrying_job_is_not_overtaken,
            groups::g2_released_job_keeps_its_place,
            groups::g2_group_runs_in_order_key_order,
            groups::g3_claim_fills_limit_past_blocked_jobs,
            groups::g4_stage_wait_does_not_hold_group,
            groups::g2_far_future_job_waits_behind_due_ones,
            batches::b1_open_batch_is_empty,
            batches::b2_later_stage_waits,
            scenarios::b2_staged_batch_runs_stage_by_stage,
            batches::b3_stage_added_while_running,
            batches::b3_lower_stage_is_closed,
            batches::b4_sealed_batch_takes_no_jobs,
            batches::b4_batch_completes_only_when_sealed,
            batches::b5_wait_returns_counts,
            batches::b5_wait_times_out,
            batches::b5_reached_follows_the_batch,
            batches::b5_reached_counts_blocked_jobs,
            batches::b6_halt_cancels_later_stages,
            batches::b6_halt_opens_no_later_stage,
            batches::b6_continue_runs_later_stages,
            batches::b7_cancel_job,
            batches::b7_cancel_releases_waiting_jobs,
            batches::b7_cancel_batch,
            monitor::m1_stats_count_each_state,
            monitor::m1_job_reads_back_fields,
            monitor::m1_batches_lists_newest_first,
            monitor::m2_dead_jobs_listed_and_retried,
            monitor::m2_retry_dead_leaves_batch_jobs,
            monitor::m2_retry_dead_revives_one_job_per_dedupe_key,
            monitor::m3_maintain_prunes_only_finished,
            errors::x1_error_kinds_are_distinct,
            errors::x2_hostile_queue_names_rejected,
            errors::x2_hostile_text_stored_verbatim,
            errors::x2_bad_labels_rejected,
            errors::x3_failed_calls_leave_nothing_behind,
        }
    };
}

/// Stamps one `#[tokio::test]` per case, each asking `$factory().await` for an
/// [`Env`]; `None` skips the case (the harness has printed why).
#[macro_export]
macro_rules! suite {
    ($factory:path) => {
        $crate::for_each_case!($crate::__relayq_stamp!($factory));
    };
}

/// Internal: stamps the tests for [`suite!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __relayq_stamp {
    ($factory:path ; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(env) = $factory().await else { return };
                if let Err(e) = $crate::cases::$module::$case(&env).await {
                    panic!("{}::{} failed: {e:?}", stringify!($module), stringify!($case));
                }
            }
        )*
    };
}
