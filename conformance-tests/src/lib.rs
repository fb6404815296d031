//! # relayq-conformance
//!
//! The behaviour every relayq backend must have, as tests. Each rule of the SPEC
//! (`docs/SPEC.md` in the repository) is one or more plain
//! `async fn(&Env) -> anyhow::Result<()>` cases in [`cases`], listed once in
//! [`for_each_case!`].
//!
//! A backend's conformance test target (with `harness = false`) implements [`Subject`]
//! and stamps [`suite!`], which runs every case and the [`model`] check as
//! `libtest-mimic` trials. A case whose server is absent, or that needs a
//! [`Capability`] the backend lacks, is reported as ignored, with the reason; naming
//! the server in `RELAYQ_REQUIRE` turns an absent server into a failure (see
//! [`harness`]).
//!
//! ```ignore
//! struct Postgres { url: String }
//!
//! impl Subject for Postgres {
//!     const NAME: &'static str = "postgres";
//!     const SERVER: Option<Server> = Some(Server::new("postgres", "RELAYQ_POSTGRES_URL"));
//!     const CAPABILITIES: &'static [Capability] = &[Capability::Notifications];
//!
//!     async fn open(url: Option<String>) -> anyhow::Result<Self> {
//!         let url = url.expect("SERVER is set");
//!         PostgresBackend::connect(&url).await?.migrate().await?;
//!         Ok(Self { url })
//!     }
//!
//!     async fn env(&self) -> anyhow::Result<Env> {
//!         let url = self.url.clone();
//!         let backend = PostgresBackend::connect(&url).await?;
//!         Ok(Env::new(backend, move || { let url = url.clone(); async move { ... } }))
//!     }
//! }
//!
//! relayq_conformance::suite!(Postgres);
//! ```
//!
//! Every case makes its own random queue names, so cases run in parallel and survive a
//! server left dirty by earlier runs.

pub mod cases;
mod driven;
pub mod harness;
pub mod model;
pub mod proxy;
pub mod runner;
mod subject;
mod util;

use std::{future::Future, sync::Arc};

use futures::future::BoxFuture;
use relayq_core::Backend;

pub use driven::{Driven, DriverSubject, with_query};
pub use proxy::Proxy;
pub use subject::{Capability, Skip, Subject};
pub use util::{poll_until, queue_name};

/// What a case gets: a backend handle, and a way to open more independent handles to
/// the same store (separate connections, as separate processes would have).
pub struct Env {
    backend: Arc<dyn Backend>,
    connect: Connect,
    unreachable: Option<Unreachable>,
    unmigrated: Option<Unreachable>,
    proxied: Option<(String, OpenUrl)>,
}

/// Opens a handle of the backend at a URL.
type OpenUrl =
    Box<dyn Fn(String) -> BoxFuture<'static, anyhow::Result<Arc<dyn Backend>>> + Send + Sync>;

/// Opens a handle of the backend against a server that refuses connections.
type Unreachable =
    Box<dyn Fn() -> BoxFuture<'static, relayq_core::Result<Arc<dyn Backend>>> + Send + Sync>;

/// The password a subject puts in the URL given to [`Env::with_unreachable`]: no
/// error may show it (SPEC X4).
pub const UNREACHABLE_PASSWORD: &str = "s3cretpw";

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
            unreachable: None,
            unmigrated: None,
            proxied: None,
        }
    }

    /// An environment over the shared handle `backend`, with `connect` opening further
    /// handles.
    pub fn from_shared<F, Fut>(backend: Arc<dyn Backend>, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        Self {
            backend,
            connect: Box::new(move || Box::pin(connect())),
            unreachable: None,
            unmigrated: None,
            proxied: None,
        }
    }

    /// The same environment, with `open` opening a handle of this backend at a URL:
    /// the server's `url` with its host and port replaced by a [`Proxy`]'s, for the
    /// subjects that declare [`Capability::ConnectionCut`] (SPEC X3).
    #[must_use]
    pub fn with_proxy<F, Fut>(mut self, url: impl Into<String>, open: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        self.proxied = Some((url.into(), Box::new(move |url| Box::pin(open(url)))));
        self
    }

    /// A new handle whose connections go through a fresh [`Proxy`] to the server, and
    /// the proxy; `None` when the subject gave no way to (see [`Env::with_proxy`]).
    ///
    /// # Errors
    /// When the URL has no host and port, the proxy cannot start or the handle cannot
    /// connect.
    pub async fn proxied(&self) -> Option<anyhow::Result<(Proxy, Arc<dyn Backend>)>> {
        let (url, open) = self.proxied.as_ref()?;
        Some(
            async {
                let mut url = url::Url::parse(url)?;
                let host = url
                    .host_str()
                    .ok_or_else(|| anyhow::anyhow!("{url}: no host"))?
                    .to_owned();
                let port = url.port().ok_or_else(|| {
                    anyhow::anyhow!("{url}: the connection-cut case needs the port in the URL")
                })?;
                let server = tokio::net::lookup_host((host.as_str(), port))
                    .await?
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{host}: no address"))?;
                let proxy = Proxy::start(server).await?;
                url.set_ip_host(proxy.addr().ip())
                    .map_err(|()| anyhow::anyhow!("{url}: cannot set the host"))?;
                url.set_port(Some(proxy.addr().port()))
                    .map_err(|()| anyhow::anyhow!("{url}: cannot set the port"))?;
                let handle = open(url.to_string()).await?;
                Ok((proxy, handle))
            }
            .await,
        )
    }

    /// The same environment, with `open` opening this backend against a server that
    /// refuses connections (a closed loopback port), its URL holding the password
    /// [`UNREACHABLE_PASSWORD`]: for the subjects that declare
    /// [`Capability::Unreachable`].
    #[must_use]
    pub fn with_unreachable<F, Fut>(mut self, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = relayq_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        self.unreachable = Some(Box::new(move || Box::pin(open())));
        self
    }

    /// Opens a handle against a server that refuses connections; `None` when the
    /// subject gave no way to (see [`Env::with_unreachable`]).
    pub async fn open_unreachable(&self) -> Option<relayq_core::Result<Arc<dyn Backend>>> {
        match &self.unreachable {
            Some(open) => Some(open().await),
            None => None,
        }
    }

    /// The same environment, with `open` opening this backend without migrating, on a
    /// namespace (a schema) nobody migrated, a fresh one each call: for the subjects
    /// that declare [`Capability::Schema`].
    #[must_use]
    pub fn with_unmigrated<F, Fut>(mut self, open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = relayq_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        self.unmigrated = Some(Box::new(move || Box::pin(open())));
        self
    }

    /// Opens a handle on a namespace nobody migrated, without migrating; `None` when
    /// the subject gave no way to (see [`Env::with_unmigrated`]).
    pub async fn open_unmigrated(&self) -> Option<relayq_core::Result<Arc<dyn Backend>>> {
        match &self.unmigrated {
            Some(open) => Some(open().await),
            None => None,
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
/// one list of cases; `=> Capability` after a case names the [`Capability`] it needs
/// (`=> A & B` for several).
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
            claim::c6_update_queue_changes_only_what_it_names,
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
            lease::l5_a_wait_in_the_worker_moves_the_logged_start,
            lease::l5_running_lists_holders,
            lease::l6_settle_many_judges_each_lease,
            lease::l6_completions_alone_judge_each_lease,
            lease::l6_lease_repeated_in_one_call_settles_once,
            lease::l6_completion_repeated_in_a_call_of_completions,
            lease::l6_a_full_call_settles_every_lease,
            lease::l6_rejected_settle_call_settles_nothing,
            progress::l7_progress_is_stored_under_the_lease,
            progress::l7_bad_progress_stores_nothing,
            progress::l7_worker_writes_progress_and_keeps_the_result,
            progress::l8_result_is_kept_whole_or_refused,
            scenarios::g1_groups_exclusive_and_ordered_under_load,
            groups::g2_retrying_job_is_not_overtaken,
            groups::g2_released_job_keeps_its_place,
            groups::g2_released_retry_keeps_its_place,
            groups::g2_group_runs_in_order_key_order,
            groups::g3_claim_fills_limit_past_blocked_jobs,
            groups::g4_stage_wait_does_not_hold_group,
            groups::g2_far_future_job_waits_behind_due_ones,
            keys::k1_bad_keys_and_limits_are_refused => LimitKeys,
            keys::k2_a_claim_takes_at_most_each_key_s_limit => LimitKeys,
            keys::k2_a_limit_holds_under_concurrent_claimers_and_expiry => LimitKeys,
            keys::k2_every_way_out_of_running_frees_the_slot => LimitKeys,
            keys::k3_limits_change_at_run_time => LimitKeys,
            keys::k4_a_waiting_key_does_not_block_others => LimitKeys,
            keys::k4_a_long_backlog_of_a_full_key_is_passed_at_once => KeyBacklogs,
            keys::k4_jobs_parked_at_enqueue_all_run => LimitKeys,
            keys::k4_a_key_starts_in_order_past_parked_jobs => LimitKeys,
            keys::k4_a_cancelled_waiting_job_passes_its_turn_on => LimitKeys,
            keys::k5_groups_and_keys_combine => LimitKeys,
            keys::k6_claims_ahead_leave_a_key_s_last_slot => LimitKeys,
            keys::k6_claims_ahead_under_max_running => LimitKeys,
            keys::k7_why_names_a_full_key => LimitKeys,
            rates::k8_bad_rates_are_refused => Rates,
            rates::k9_no_window_holds_more_than_the_count => Rates,
            rates::k9_a_rate_and_key_limits_combine => Rates & LimitKeys,
            rates::k9_the_default_burst_lets_a_claim_take_many => Rates,
            rates::k10_a_cut_claim_names_the_wait => Rates,
            rates::k10_only_the_rate_names_a_wait => Rates,
            key_rates::k12_bad_key_rates_are_refused => KeyRates,
            key_rates::k12_a_key_s_rate_holds_its_jobs_and_no_others => KeyRates,
            key_rates::k12_the_default_rate_gives_each_key_its_own => KeyRates,
            key_rates::k12_no_window_holds_more_than_a_key_s_count => KeyRates,
            key_rates::k13_a_held_key_starts_again_when_its_rate_allows => KeyRates,
            key_rates::k13_a_full_key_names_no_wake => KeyRates,
            after::d1_a_diamond_runs_in_order => Dependencies,
            after::d1_stored_ids_fan_out_and_fan_in => Dependencies,
            after::d2_only_a_fenced_success_releases => Dependencies,
            after::d2_last_dependencies_settled_at_once => Dependencies,
            after::d2_a_cancel_at_enqueue_starts_no_child_early => Dependencies,
            after::d3_dependencies_stages_and_groups_combine => Dependencies,
            after::d4_a_dead_dependency_cancels_down_the_graph => Dependencies,
            after::d4_the_batch_policy_and_the_job_override => Dependencies,
            after::d4_every_way_to_fail_reaches_dependents => Dependencies,
            after::d4_a_batch_cancel_counts_every_job => Dependencies,
            after::d5_bad_dependencies_store_nothing => Dependencies,
            after::d5_dependencies_are_kept_or_refused,
            after::d6_why_names_unfinished_dependencies => Dependencies,
            after::d6_wait_for_one_job => Dependencies,
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
            cancel::b8_lost_leases_names_what_no_longer_holds,
            cancel::b8_cancel_stops_the_running_handler,
            cancel::b8_cancel_reaches_a_worker_that_only_reads,
            cancel::b8_a_worker_whose_listener_is_away_still_stops,
            cancel::b8_halt_stops_the_running_siblings,
            cancel::b8_a_halt_in_an_expiry_pass_keeps_its_cancels,
            cancel::b8_a_job_cancelled_in_the_buffer_stops_as_it_starts,
            purge::b9_purge_cancels_every_unfinished_job,
            purge::b9_purge_stops_the_running_handlers,
            monitor::m1_stats_count_each_state,
            monitor::m1_job_reads_back_fields,
            monitor::m1_batches_lists_newest_first,
            monitor::m1_a_batch_says_when_it_opened_and_last_finished,
            monitor::m2_dead_jobs_listed_and_retried,
            monitor::m2_retry_dead_leaves_batch_jobs,
            monitor::m2_retry_dead_revives_one_job_per_dedupe_key,
            monitor::m3_maintain_prunes_only_finished,
            monitor::m3_try_maintain_prunes_when_free,
            monitor::m3_workers_prune_on_a_timer,
            monitor::m4_queues_lists_queues_in_use,
            monitor::m5_batch_jobs_lists_a_batch_page_by_page,
            monitor::m1_oldest_ready_is_the_longest_wait,
            monitor::m6_why_names_what_holds_a_job,
            monitor::m6_why_names_a_retrying_group_holder,
            listing::m7_list_jobs_finds_any_job_by_filter,
            listing::m7_a_rare_match_is_found_past_the_scan_bound,
            listing::m8_delete_jobs_removes_only_finished_ones,
            listing::m10_run_now_makes_only_time_bound_jobs_due,
            workers::m9_workers_lists_each_worker_s_last_beat,
            workers::m9_a_running_worker_beats,
            schedules::s1_schedules_are_stored_replaced_and_checked,
            schedules::s1_a_batch_schedule_makes_a_sealed_staged_batch,
            schedules::s2_two_schedulers_enqueue_each_slot_once,
            schedules::s2_fire_refuses_what_is_not_due,
            schedules::s2_pruning_does_not_bring_a_slot_back,
            schedules::s3_missed_slots_follow_the_policy,
            schedules::s4_daylight_saving_changes_run_each_slot_once,
            schedules::s5_pause_resume_and_delete,
            schedules::s5_run_now_is_an_extra_run,
            errors::x1_error_kinds_are_distinct,
            errors::x1_a_missing_schema_is_a_schema_error => Schema,
            errors::x2_hostile_queue_names_rejected,
            errors::x2_hostile_text_stored_verbatim,
            errors::x2_bad_labels_rejected,
            errors::x3_failed_calls_leave_nothing_behind,
            cut::x3_cut_connections_lose_nothing_and_hold_nothing_twice => ConnectionCut,
            errors::x4_unreachable_server_is_transient_quick_and_masked => Unreachable,
            events::w2_enqueue_and_finish_wake_subscribers => Notifications,
        }
    };
}

/// Every case of the suite, in the order of [`for_each_case!`].
#[must_use]
pub fn cases() -> &'static [runner::Case] {
    macro_rules! list {
        ($($module:ident :: $case:ident $(=> $($needs:ident)&+)?),* $(,)?) => {
            &[$(runner::Case {
                module: stringify!($module),
                name: stringify!($case),
                needs: &[$($(Capability::$needs),+)?],
                run: |env| Box::pin(cases::$module::$case(env)),
            }),*]
        };
    }
    for_each_case!(list!)
}

/// The `main` of a backend's conformance test target (`harness = false`): every case
/// and the model check against the [`Subject`] `$subject`, then any further trials
/// given (iterables of `libtest_mimic::Trial`, e.g. from [`runner::server_test`]).
#[macro_export]
macro_rules! suite {
    ($subject:ty $(, $extra:expr)* $(,)?) => {
        fn main() {
            #[allow(unused_mut)]
            let mut trials = $crate::runner::suite::<$subject>();
            $(trials.extend($extra);)*
            $crate::runner::run(trials)
        }
    };
}

/// The `main` of a backend's own test target (`harness = false`): each `async fn(url:
/// String)` of `tests` gets the URL of `server` (or is reported as ignored without
/// one, or fails when `RELAYQ_REQUIRE` names it); each `async fn()` of `local` runs as
/// it is.
#[macro_export]
macro_rules! server_tests {
    (
        server: $server:expr,
        tests: [$($test:ident),* $(,)?]
        $(, local: [$($local:ident),* $(,)?])?
        $(,)?
    ) => {
        fn main() {
            $crate::runner::run(vec![
                $($crate::runner::server_test($server, stringify!($test), $test),)*
                $($($crate::runner::local_test(stringify!($local), $local),)*)?
            ])
        }
    };
}
