//! Runs tests as `libtest-mimic` trials, so that a test whose server is absent is
//! reported as ignored, with the reason, and never as passed (plain libtest cannot mark
//! a running test ignored: an early `return` counts as a pass).
//!
//! A test target using it sets `harness = false` in its crate's `Cargo.toml` and gets
//! its `main` from [`suite!`](crate::suite) (the conformance cases and the model check
//! for a [`Subject`]) or [`server_tests!`](crate::server_tests) (a backend's own tests).

use std::{
    future::Future,
    panic::{AssertUnwindSafe, catch_unwind, resume_unwind},
    sync::{Arc, OnceLock},
};

use futures::future::LocalBoxFuture;
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tokio::runtime::Runtime;

use crate::{
    Env, harness,
    harness::Server,
    model,
    subject::{Capability, Skip, Subject},
};

/// One case of the suite, as listed by [`for_each_case!`](crate::for_each_case).
#[derive(Clone, Copy)]
pub struct Case {
    /// Its module under [`crate::cases`]: the SPEC section.
    pub module: &'static str,
    /// Its name, which starts with the rule it checks.
    pub name: &'static str,
    /// The capabilities it needs (none for most).
    pub needs: &'static [Capability],
    /// The case itself.
    pub run: for<'a> fn(&'a Env) -> LocalBoxFuture<'a, anyhow::Result<()>>,
}

/// The name of the model check's trial in every subject's suite.
pub const MODEL_CHECK: &str = "model_agrees_with_the_reference";

/// Runs `trials` with the command line's arguments and exits with libtest's code.
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

/// The suite's trials for `S`: one per case, and the model check.
#[must_use]
pub fn suite<S: Subject>() -> Vec<Trial> {
    let shared: Shared<S> = Arc::default();
    let mut trials: Vec<Trial> = crate::cases()
        .iter()
        .map(|case| case_trial(*case, shared.clone()))
        .collect();
    trials.push(model_trial(shared));
    trials
}

/// What the cases of a subject find: opened once, by the first case that runs.
type Shared<S> = Arc<OnceLock<Opened<S>>>;

struct Opened<S> {
    status: Status<S>,
    /// The runtime `open` ran on, kept for whatever it spawned.
    _runtime: Option<Runtime>,
}

enum Status<S> {
    Ready(S),
    Skip(String),
    Fail(String),
}

/// The subject, or the trial's outcome without it.
fn subject<S: Subject>(shared: &Shared<S>) -> Result<&S, Result<Completion, Failed>> {
    let opened = shared.get_or_init(open::<S>);
    match &opened.status {
        Status::Ready(s) => Ok(s),
        Status::Skip(why) => Err(Ok(Completion::ignored_with(why))),
        Status::Fail(why) => Err(Err(why.into())),
    }
}

fn open<S: Subject>() -> Opened<S> {
    let runtime = match runtime(1) {
        Ok(rt) => rt,
        Err(e) => {
            return Opened {
                status: Status::Fail(format!("starting a runtime failed: {e}")),
                _runtime: None,
            };
        }
    };
    let status = match S::SERVER.map(|server| (server, runtime.block_on(harness::locate(server)))) {
        Some((server, Err(why))) => absent(server, &why),
        found => match runtime.block_on(S::open(found.and_then(|(_, url)| url.ok()))) {
            Ok(subject) => Status::Ready(subject),
            Err(e) => match e.downcast_ref::<Skip>() {
                Some(skip) => Status::Skip(format!("{}: {skip}", S::NAME)),
                None => Status::Fail(format!("opening {} failed: {e:#}", S::NAME)),
            },
        },
    };
    Opened {
        status,
        _runtime: Some(runtime),
    }
}

/// A missing server: a failure when `RELAYQ_REQUIRE` names it, else a skip.
fn absent<S>(server: Server, why: &str) -> Status<S> {
    let name = server.name();
    if harness::required(server) {
        Status::Fail(format!("RELAYQ_REQUIRE names {name}, but {why}"))
    } else {
        Status::Skip(format!("no {name} server: {why}"))
    }
}

fn runtime(workers: usize) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
}

fn case_trial<S: Subject>(case: Case, shared: Shared<S>) -> Trial {
    Trial::ignorable_test(case.name, move || {
        if let Some(needs) = case.needs.iter().find(|c| !S::CAPABILITIES.contains(c)) {
            return Ok(Completion::ignored_with(format!(
                "needs the {needs} capability, which {} does not declare",
                S::NAME
            )));
        }
        let subject = match subject(&shared) {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        runtime(4)?
            .block_on(async {
                let env = subject.env().await?;
                (case.run)(&env).await
            })
            .map_err(|e| format!("{}::{} failed: {e:?}", case.module, case.name))?;
        Ok(Completion::Completed)
    })
    .with_kind(S::NAME)
}

/// Random operation sequences on the subject and on the reference model must agree
/// (see [`model`]); proptest shrinks a disagreement to its shortest sequence, and keeps
/// its seed in the crate's `tests/model.proptest-regressions` for later runs.
fn model_trial<S: Subject>(shared: Shared<S>) -> Trial {
    Trial::ignorable_test(MODEL_CHECK, move || {
        let subject = match subject(&shared) {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        let rt = runtime(2)?;
        let env = rt.block_on(subject.env()).map_err(|e| format!("{e:#}"))?;
        let backend = env.shared();
        // More cases for a longer hunt: RELAYQ_MODEL_CASES=1000.
        let cases = std::env::var("RELAYQ_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(48);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
                "tests/model.proptest-regressions",
            ))),
            ..Config::default()
        });
        runner
            .run(&model::ops(40), |ops| {
                rt.block_on(model::check(model::reference(), backend.clone(), &ops))
                    .map_err(|e| TestCaseError::fail(format!("{e:#}")))
            })
            .map_err(|e| format!("{} disagrees with the model: {e}", S::NAME))?;
        Ok(Completion::Completed)
    })
    .with_kind(S::NAME)
}

/// A test that needs `server`: it gets the server's URL; without one it is reported as
/// ignored, or fails when `RELAYQ_REQUIRE` names the server.
pub fn server_test<F, Fut>(server: Server, name: &str, test: F) -> Trial
where
    F: FnOnce(String) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::ignorable_test(name, move || {
        let rt = runtime(4)?;
        match rt.block_on(harness::locate(server)) {
            Ok(url) => unless_skipped(|| rt.block_on(test(url))),
            Err(why) => match absent::<()>(server, &why) {
                Status::Fail(why) => Err(why.into()),
                _ => Ok(Completion::ignored_with(format!(
                    "no {} server: {why}",
                    server.name()
                ))),
            },
        }
    })
    .with_kind(server.name())
}

/// A test that needs no server, on a multi-threaded runtime as `#[tokio::test]` would
/// give it.
pub fn local_test<F, Fut>(name: &str, test: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::ignorable_test(name, move || {
        let rt = runtime(4)?;
        unless_skipped(|| rt.block_on(test()))
    })
}

/// Ends the running test of [`server_test`] or [`local_test`] as ignored, with
/// `reason`: for what only shows once the test runs (a server too old for the feature
/// under test, a program that is not installed). It unwinds without the panic hook, so
/// nothing is printed as a panic. Call it on the test's own task, not a spawned one.
pub fn skip(reason: impl Into<String>) -> ! {
    resume_unwind(Box::new(Skipped(reason.into())))
}

/// Like [`skip`] for something `server`'s tests need (its program installed, a
/// version), but a failure when `RELAYQ_REQUIRE` names `server`.
pub fn missing(server: Server, reason: &str) -> ! {
    assert!(
        !harness::required(server),
        "RELAYQ_REQUIRE names {}, but {reason}",
        server.name()
    );
    skip(reason)
}

/// The payload [`skip`] unwinds with.
struct Skipped(String);

/// Runs `test`; a [`skip`] inside it becomes an ignored outcome, other panics go on.
fn unless_skipped(test: impl FnOnce()) -> Result<Completion, Failed> {
    match catch_unwind(AssertUnwindSafe(test)) {
        Ok(()) => Ok(Completion::Completed),
        Err(payload) => match payload.downcast::<Skipped>() {
            Ok(skipped) => Ok(Completion::ignored_with(skipped.0)),
            Err(other) => resume_unwind(other),
        },
    }
}
