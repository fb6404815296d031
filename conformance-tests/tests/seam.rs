//! The runner reports what it cannot run as ignored, never as passed: a case that needs a
//! capability the subject lacks, every case of a subject whose server is absent, and a
//! test that finds out while running that it cannot (`runner::skip`).

use std::sync::Arc;

use libtest_mimic::{Arguments, Conclusion};
use relayq_conformance::{
    Env, Subject,
    harness::{Server, names},
    runner,
};
use relayq_core::{Backend, memory::MemoryBackend};

/// The memory backend, declaring no capability.
struct Bare;

impl Subject for Bare {
    const NAME: &'static str = "bare";

    async fn open(_: Option<String>) -> anyhow::Result<Self> {
        Ok(Self)
    }

    async fn env(&self) -> anyhow::Result<Env> {
        let backend = MemoryBackend::new();
        let shared = backend.clone();
        Ok(Env::new(backend, move || {
            let handle: Arc<dyn Backend> = Arc::new(shared.clone());
            async move { Ok(handle) }
        }))
    }
}

/// A server no one runs: its variable is never set.
struct Absent;

impl Subject for Absent {
    const NAME: &'static str = "absent";
    const SERVER: Option<Server> = Some(Server::new("absent", "RELAYQ_NO_SUCH_SERVER_URL"));

    async fn open(_: Option<String>) -> anyhow::Result<Self> {
        panic!("opened a subject whose server is absent")
    }

    async fn env(&self) -> anyhow::Result<Env> {
        unreachable!()
    }
}

/// Runs `trials` matching `filter`, printing nothing: a `test result:` line of these
/// inner runs would read as this binary's own.
fn run(trials: Vec<libtest_mimic::Trial>, filter: &str) -> Conclusion {
    let args = Arguments {
        filter: Some(filter.to_owned()),
        test_threads: Some(1),
        logfile: Some("/dev/null".to_owned()),
        ..Arguments::default()
    };
    libtest_mimic::run(&args, trials)
}

#[test]
fn a_case_needing_a_missing_capability_is_ignored() {
    let c = run(
        runner::suite::<Bare>(),
        "w2_enqueue_and_finish_wake_subscribers",
    );
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (0, 0, 1));
    // The same subject runs the cases that need nothing.
    let c = run(runner::suite::<Bare>(), "e1_returns_ids_in_order");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (1, 0, 0));
}

#[test]
fn every_trial_of_an_absent_server_is_ignored() {
    let trials = runner::suite::<Absent>();
    let all = trials.len() as u64;
    assert!(all > 70, "the suite has {all} trials");
    let c = run(trials, "");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (0, 0, all));
    let server = Server::new("absent", "RELAYQ_NO_SUCH_SERVER_URL");
    let test = runner::server_test(server, "needs_the_server", |_url| async {
        panic!("ran without its server")
    });
    let c = run(vec![test], "");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (0, 0, 1));
}

#[test]
fn a_test_that_skips_while_running_is_ignored_and_a_panic_still_fails() {
    let skips = runner::local_test("skips", || async {
        runner::skip("redis-server is not installed");
    });
    let c = run(vec![skips], "");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (0, 0, 1));
    let panics = runner::local_test("panics", || async { panic!("a real failure") });
    let c = run(vec![panics], "");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (0, 1, 0));
    let passes = runner::local_test("passes", || async {});
    let c = run(vec![passes], "");
    assert_eq!((c.num_passed, c.num_failed, c.num_ignored), (1, 0, 0));
}

#[test]
fn relayq_require_is_a_comma_separated_list_of_names() {
    let redis = Server::new("redis", "RELAYQ_REDIS_URL");
    assert!(names("postgres, redis", redis));
    assert!(names("redis", redis));
    assert!(!names("redis-cluster", redis));
    assert!(!names("", redis));
}
