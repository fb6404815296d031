//! A worker's claims, settles and handler runs, and enqueues through [`Traced`], each
//! run in a span naming the queue (crate `relayq_core::traced`). A capturing
//! subscriber, installed for the whole (one-test) process, records every new span.

use std::{
    fmt::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use relayq_core::{
    Backend, EnqueueExt, JobState, NewJob, Traced,
    memory::MemoryBackend,
    worker::{JobError, Worker},
};
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id},
};
use tracing_subscriber::{
    layer::{Context, SubscriberExt},
    registry::LookupSpan,
};

type Seen = Arc<Mutex<Vec<String>>>;

/// Records `name field=value ...` for every new span.
struct Capture(Seen);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut fields = Fields(attrs.metadata().name().to_owned());
        attrs.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_claim_settle_and_each_job_run_in_spans() {
    let seen: Seen = Arc::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Capture(seen.clone())),
    )
    .expect("the only subscriber of this test process");

    let memory: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let traced = Traced::new(memory.clone());
    let q = "spans";
    let first = traced
        .enqueue_one(NewJob::new(q, b"a".to_vec()))
        .await
        .unwrap();
    let worker = Worker::builder(memory.clone(), [q])
        .handler(|_job| async { Ok::<_, JobError>(()) })
        .build()
        .unwrap()
        .spawn();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while memory
        .queue_stats(q)
        .await
        .unwrap()
        .count(JobState::Succeeded)
        < 1
    {
        assert!(tokio::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let has = |name: &str, parts: &[&str]| {
        seen.iter()
            .any(|s| s.split(' ').next() == Some(name) && parts.iter().all(|p| s.contains(p)))
    };
    assert!(
        has("relayq.enqueue", &["queue=spans", "jobs=1"]),
        "{seen:#?}"
    );
    assert!(has("relayq.claim", &["queue=spans", "limit="]), "{seen:#?}");
    let id = format!("id={}", first.id);
    assert!(
        has("relayq.job", &["queue=spans", &id, "attempt=1"]),
        "{seen:#?}"
    );
    let first_id = format!("first_id={}", first.id.0);
    assert!(
        has("relayq.settle", &["queue=spans", "leases=1", &first_id]),
        "{seen:#?}"
    );
}
