//! The dashboard in a real browser: headless Chromium through chromedriver (WebDriver),
//! against a dashboard and a worker on SQLite, and on PostgreSQL and Redis where
//! `RELAYQ_POSTGRES_URL` / `RELAYQ_REDIS_URL` point.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`/usr/bin/chromium`,
//! `/usr/bin/chromedriver`; `RELAYQ_CHROMIUM` and `RELAYQ_CHROMEDRIVER` override).
//! Without them the test is reported as ignored, or failed when `RELAYQ_REQUIRE`
//! contains `browser`; so is a server whose URL is unset. With
//! `RELAYQ_DASHBOARD_SCREENSHOTS=DIR` the SQLite run saves `dashboard-*.png` there.

mod common;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use common::*;
use fantoccini::{Client, ClientBuilder};
use relayq_core::{Backend, ClaimedJob, EnqueueExt, JobState, NewJob, OnFailure, worker::Worker};
use relayq_dashboard::{Options, router};
use serde_json::{Value, json};
use tokio::{sync::watch, time::Instant};

fn main() {
    use relayq_conformance::{
        harness::Server,
        runner::{local_test, run, server_test},
    };
    const NAME: &str = "the_dashboard_works_in_chromium";
    run(vec![
        local_test(&format!("sqlite::{NAME}"), || async {
            the_dashboard_works_in_chromium(sqlite().await, true).await;
        }),
        server_test(
            Server::of(&relayq::postgres::DRIVER),
            &format!("postgres::{NAME}"),
            |url| async move {
                the_dashboard_works_in_chromium(server(&url).await, false).await;
            },
        ),
        server_test(
            Server::of(&relayq::redis::DRIVER),
            &format!("redis::{NAME}"),
            |url| async move {
                the_dashboard_works_in_chromium(server(&url).await, false).await;
            },
        ),
    ])
}

/// What `RELAYQ_REQUIRE` names for this test's programs.
const BROWSER: relayq_conformance::harness::Server =
    relayq_conformance::harness::Server::new("browser", "RELAYQ_CHROMEDRIVER");

const PWN: &str = r#"<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">"#;
const WAIT: Duration = Duration::from_secs(20);

/// Kills the child when the test ends, pass or fail.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tool(var: &str, default: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    path.exists().then_some(path)
}

/// Starts chromedriver on a free port; its URL. Three tries: with the three backends'
/// tests starting one each at once, a chromedriver has been seen to exit before it
/// said its port; what it printed is in the failure.
fn chromedriver(path: &PathBuf) -> (Kill, String) {
    let mut said = Vec::new();
    for _ in 0..3 {
        // Its errors to a file, not a pipe: a pipe closed once the port is known would
        // make its later writes fail.
        let log = tempfile::NamedTempFile::new().expect("chromedriver's log");
        let mut child = Command::new(path)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(log.reopen().expect("chromedriver's log"))
            .spawn()
            .expect("start chromedriver");
        let stdout = child.stdout.take().unwrap();
        let child = Kill(child);
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("chromedriver's output");
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                let port = rest.trim_end_matches('.').trim();
                return (child, format!("http://127.0.0.1:{port}"));
            }
            said.push(line);
        }
        said.push(std::fs::read_to_string(log.path()).unwrap_or_default());
    }
    panic!(
        "chromedriver ended three times without saying its port: {}",
        said.join("\n")
    );
}

async fn browser(webdriver: &str, chromium: &PathBuf, profile: &tempfile::TempDir) -> Client {
    let args = [
        "--headless".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--window-size=1280,860".to_owned(),
        format!("--user-data-dir={}", profile.path().display()),
    ];
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({ "binary": chromium, "args": args }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(webdriver)
        .await
        .expect("a WebDriver session")
}

/// Runs `script` (which returns a value) until `done` accepts it, or fails after WAIT.
async fn until(b: &Client, what: &str, script: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let value = b.execute(script, vec![]).await.expect(what);
        if done(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: last saw {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of the first element `selector` matches, or null.
fn text_of(selector: &str) -> String {
    format!(
        "const e = document.querySelector({}); return e ? e.textContent : null;",
        json!(selector)
    )
}

/// Clicks the first element `selector` matches, as the user's click would.
async fn click(b: &Client, selector: &str) {
    let script = format!(
        "const e = document.querySelector({}); if (!e) return false; e.click(); return true;",
        json!(selector)
    );
    until(b, &format!("click {selector}"), &script, |v| {
        v == &json!(true)
    })
    .await;
}

async fn screenshot(b: &Client, name: &str, wanted: bool) {
    if let Some(dir) = std::env::var_os("RELAYQ_DASHBOARD_SCREENSHOTS").filter(|_| wanted) {
        let png = b.screenshot().await.expect("a screenshot");
        std::fs::write(
            PathBuf::from(dir).join(format!("dashboard-{name}.png")),
            png,
        )
        .unwrap();
    }
}

async fn no_injected_markup(b: &Client) {
    let script = "return [document.querySelectorAll('#content script, #content img').length, window.__pwned === undefined];";
    let seen = b.execute(script, vec![]).await.unwrap();
    assert_eq!(seen, json!([0, true]), "stored text became markup");
}

/// A worker whose jobs (payload: their stage) finish only once `gate` reaches their stage.
fn gated_worker(backend: Arc<dyn Backend>, queue: &str, gate: watch::Receiver<i32>) -> Worker {
    Worker::builder(backend, [queue])
        .concurrency(4)
        .handler(move |job: ClaimedJob| {
            let mut gate = gate.clone();
            async move {
                let stage: i32 = String::from_utf8_lossy(&job.payload).parse().unwrap_or(0);
                if let Some(ctx) = relayq_core::worker::JobContext::current() {
                    ctx.progress(50, "waiting for the gate")?;
                }
                let _ = gate.wait_for(|open| *open >= stage).await;
                Ok::<_, relayq_core::worker::JobError>(())
            }
        })
        .build()
        .unwrap()
}

async fn the_dashboard_works_in_chromium(db: Db, screenshots: bool) {
    let (Some(driver), Some(chromium)) = (
        tool("RELAYQ_CHROMEDRIVER", "/usr/bin/chromedriver"),
        tool("RELAYQ_CHROMIUM", "/usr/bin/chromium"),
    ) else {
        relayq_conformance::runner::missing(
            BROWSER,
            "no /usr/bin/chromedriver or /usr/bin/chromium (apt-get install chromium chromium-driver)",
        );
    };
    let (qb, qd) = (queue(), queue());
    let app = router(
        db.backend.clone(),
        Options {
            queues: vec![qb.clone(), qd.clone()],
            ..Options::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // A batch of three stages, run by a worker whose jobs wait for the test's word.
    let batch = db
        .backend
        .open_batch(&qb, OnFailure::Continue)
        .await
        .unwrap();
    let jobs = [1, 1, 2, 3]
        .map(|s| NewJob::new(&qb, s.to_string().into_bytes()).in_batch(batch.id, s))
        .to_vec();
    db.backend.enqueue(jobs).await.unwrap();
    db.backend.seal(&batch).await.unwrap();
    let (gate, gate_rx) = watch::channel(0);
    let worker = gated_worker(db.backend.clone(), &qb, gate_rx).spawn();

    let (_driver, webdriver) = chromedriver(&driver);
    let profile = tempfile::tempdir().unwrap();
    let b = browser(&webdriver, &chromium, &profile).await;

    // Stages advance on the batch page as the worker goes.
    b.goto(&format!("{base}/queues/{qb}/batches"))
        .await
        .unwrap();
    let stage = |n: i32| {
        text_of(&format!(
            "[data-batch=\"{}\"] [data-stage=\"{n}\"] .stage-text",
            batch.id.0
        ))
    };
    until(&b, "stage 1 running", &stage(1), |v| {
        v.as_str().is_some_and(|t| t.contains("2 running"))
    })
    .await;
    until(&b, "stage 2 waits", &stage(2), |v| {
        v.as_str().is_some_and(|t| t.contains("1 pending"))
    })
    .await;

    b.goto(&format!("{base}/queues/{qb}/running"))
        .await
        .unwrap();
    let rows = "return document.querySelectorAll('#running tbody tr').length;";
    until(&b, "two running jobs listed", rows, |v| v == &json!(2)).await;
    // Each shows its handler's progress as a bar (SPEC L7).
    let bars = "return [...document.querySelectorAll('#running progress')]
        .filter((p) => p.value === 50 && p.parentElement.textContent.includes('waiting for the gate')).length;";
    until(&b, "two progress bars at 50%", bars, |v| v == &json!(2)).await;
    screenshot(&b, "running", screenshots).await;

    b.goto(&format!("{base}/queues/{qb}/batches"))
        .await
        .unwrap();
    gate.send(1).unwrap();
    until(&b, "stage 1 done", &stage(1), |v| {
        v.as_str().is_some_and(|t| t.starts_with("2/2 done"))
    })
    .await;
    until(&b, "stage 2 running", &stage(2), |v| {
        v.as_str().is_some_and(|t| t.contains("1 running"))
    })
    .await;
    // The bar is drawn too (its widths go through the CSSOM, which the CSP allows).
    let bar = format!(
        "return document.querySelector('[data-batch=\"{}\"] [data-stage=\"1\"] .bar .succeeded')?.style.width ?? null;",
        batch.id.0
    );
    until(&b, "stage 1's bar full", &bar, |v| v == &json!("100%")).await;
    screenshot(&b, "batches", screenshots).await;

    // The batch's own page draws its attempts by worker, and follows them live: stage
    // 1's two have succeeded and stage 2's runs; then the rest finish.
    b.goto(&format!("{base}/queues/{qb}/batches/{}", batch.id.0))
        .await
        .unwrap();
    let bars = "return [document.querySelectorAll('#timeline rect.att.succeeded').length, document.querySelectorAll('#timeline rect.att.running').length, document.querySelectorAll('#timeline text.worker').length];";
    until(&b, "timeline: 2 done, 1 running", bars, |v| {
        v == &json!([2, 1, 1])
    })
    .await;
    // Stage 1's two ran at once on the one worker: one lane each, not one over the other.
    let lanes = "return new Set([...document.querySelectorAll('#timeline rect.att.succeeded')].map((r) => r.getAttribute('y'))).size;";
    until(
        &b,
        "overlapping attempts in lanes of their own",
        lanes,
        |v| v == &json!(2),
    )
    .await;
    let title =
        "return document.querySelector('#timeline rect.att.running title')?.textContent ?? null;";
    until(&b, "a running bar names its job", title, |v| {
        v.as_str()
            .is_some_and(|t| t.contains("stage 2, attempt 1") && t.contains("running"))
    })
    .await;
    gate.send(3).unwrap();
    until(&b, "timeline: all 4 done", bars, |v| v == &json!([4, 0, 1])).await;
    // Each bar links to its job's page.
    let linked = "return [...document.querySelectorAll('#timeline a')].filter((a) => /\\/jobs\\/\\d+$/.test(a.getAttribute('href')) && a.querySelector('rect.att')).length;";
    until(&b, "every bar is a link to its job", linked, |v| {
        v == &json!(4)
    })
    .await;
    screenshot(&b, "batch", screenshots).await;
    // The batch's job list, found by following its link: all four, newest first.
    click(&b, "a.batch-jobs").await;
    let listed = "return [...document.querySelectorAll('#jobs tbody tr')].map((r) => r.querySelector('.badge').textContent);";
    until(&b, "the batch's four jobs, succeeded", listed, |v| {
        v == &json!(["succeeded", "succeeded", "succeeded", "succeeded"])
    })
    .await;
    b.goto(&format!("{base}/queues/{qb}/batches"))
        .await
        .unwrap();
    until(&b, "stage 3 done", &stage(3), |v| {
        v.as_str().is_some_and(|t| t.starts_with("1/1 done"))
    })
    .await;
    // The finished batch says when it was opened and how long it took.
    until(
        &b,
        "the batch's times",
        &text_of(&format!("[data-batch=\"{}\"] .batch-times", batch.id.0)),
        |v| {
            v.as_str()
                .is_some_and(|t| t.starts_with("opened ") && t.contains(" · took "))
        },
    )
    .await;

    // A dead job whose payload and error are markup shows them as text; retry puts it
    // back to ready (its queue has no worker, so it stays there).
    let dead = dead_job(db.backend.as_ref(), &qd, PWN, PWN).await;
    // A limit key named in markup, shown under the queue's header (SPEC K7).
    db.backend
        .set_key_limit(&qd, Some(PWN), Some(1))
        .await
        .unwrap();
    // And the key's rate (SPEC K14).
    let key_rate = relayq_core::Rate::new(5, Duration::from_secs(1));
    db.backend
        .set_key_rate(&qd, Some(PWN), Some(key_rate))
        .await
        .unwrap();
    // And its rate (SPEC K11).
    let rate = relayq_core::Rate::new(5, Duration::from_secs(1));
    db.backend
        .update_queue(&qd, relayq_core::QueueUpdate::default().rate(Some(rate)))
        .await
        .unwrap();
    b.goto(&format!("{base}/queues/{qd}/dead")).await.unwrap();
    let row = format!("[data-job=\"{}\"]", dead.0);
    until(
        &b,
        "payload as text",
        &text_of(&format!("{row} pre.payload")),
        |v| v == &json!(PWN),
    )
    .await;
    until(
        &b,
        "error as text",
        &text_of(&format!("{row} pre.error-text")),
        |v| v == &json!(PWN),
    )
    .await;
    until(&b, "the limit key as text", &text_of("#keys .key"), |v| {
        v == &json!(format!("{PWN} 0 / 1 · at most 5/1s"))
    })
    .await;
    until(&b, "the queue's rate", &text_of("#queue-rate"), |v| {
        v.as_str().is_some_and(|t| t.contains("rate at most 5/1s"))
    })
    .await;
    no_injected_markup(&b).await;
    screenshot(&b, "dead", screenshots).await;
    click(&b, &format!("{row} button[data-action=\"retry\"]")).await;
    let gone = format!(
        "return document.querySelector({}) === null && document.querySelector('#content p') !== null;",
        json!(row)
    );
    until(&b, "the row leaves the dead list", &gone, |v| {
        v == &json!(true)
    })
    .await;
    assert_eq!(
        db.backend.job(&qd, dead).await.unwrap().state,
        JobState::Ready
    );
    b.goto(&format!("{base}/queues/{qd}/jobs/{}", dead.0))
        .await
        .unwrap();
    until(
        &b,
        "the job page says ready",
        &text_of("#job .badge"),
        |v| v == &json!("ready"),
    )
    .await;
    until(
        &b,
        "the job page says why it waits",
        &text_of("#why li"),
        |v| v == &json!("nothing holds it: the next claim of its queue may take it"),
    )
    .await;
    until(
        &b,
        "attempt error as text",
        &text_of("#attempts pre"),
        |v| v == &json!(PWN),
    )
    .await;
    no_injected_markup(&b).await;
    screenshot(&b, "job", screenshots).await;

    // Pausing from the queue list pauses the queue.
    b.goto(&format!("{base}/")).await.unwrap();
    let qrow = format!("tr[data-queue=\"{qb}\"]");
    until(&b, "queue row", &text_of(&format!("{qrow} td")), |v| {
        v.is_string()
    })
    .await;
    // The wait of the queue's longest-waiting job: a time or a dash, never blank.
    until(
        &b,
        "oldest ready cell",
        &text_of(&format!("{qrow} td.oldest")),
        |v| {
            v.as_str()
                .is_some_and(|t| t == "—" || t.ends_with(" s") || t.ends_with(" min"))
        },
    )
    .await;
    // The queue whose job was retried has a ready job and no worker: it says so. The
    // one the gated worker serves does not.
    until(
        &b,
        "the unserved queue is flagged",
        &text_of(&format!("tr[data-queue=\"{qd}\"] .no-worker")),
        |v| v == &json!("no worker"),
    )
    .await;
    let flagged = format!("return document.querySelector('{qrow} .no-worker') !== null;");
    assert_eq!(b.execute(&flagged, vec![]).await.unwrap(), json!(false));
    click(&b, &format!("{qrow} button[data-action=\"pause\"]")).await;
    until(
        &b,
        "paused badge",
        &text_of(&format!("{qrow} .badge.paused")),
        |v| v == &json!("paused"),
    )
    .await;
    assert!(db.backend.queue_stats(&qb).await.unwrap().paused);
    screenshot(&b, "queues", screenshots).await;

    // The jobs page: any job found by its name or its error; a secret in a payload
    // stays masked; ticked jobs are cancelled in one action.
    let qj = queue();
    let made = db
        .backend
        .enqueue(vec![
            NewJob::new(&qj, br#"{"name":"load-a","command":"x"}"#.to_vec()),
            NewJob::new(&qj, br#"{"name":"load-b","command":"x"}"#.to_vec()),
            NewJob::new(
                &qj,
                br#"{"name":"other","env":{"API_TOKEN":"s3cret"}}"#.to_vec(),
            ),
        ])
        .await
        .unwrap();
    let ids: Vec<i64> = made.iter().map(|e| e.id.0).collect();
    b.goto(&format!("{base}/queues/{qj}/jobs")).await.unwrap();
    let names = "return [...document.querySelectorAll('#jobs td.name')].map((c) => c.textContent);";
    until(&b, "every job, newest first", names, |v| {
        v == &json!(["other", "load-b", "load-a"])
    })
    .await;
    let secret = "return document.querySelector('#content').textContent.includes('s3cret');";
    assert_eq!(b.execute(secret, vec![]).await.unwrap(), json!(false));
    // A filter typed into the form.
    let filter = "const f = document.querySelector('#job-filter');         f.elements.text.value = 'load-'; f.requestSubmit(); return true;";
    b.execute(filter, vec![]).await.unwrap();
    until(&b, "the filter finds load-b and load-a", names, |v| {
        v == &json!(["load-b", "load-a"])
    })
    .await;
    screenshot(&b, "jobs", screenshots).await;
    // Tick load-a, confirm, cancel.
    b.execute("window.confirm = () => true; return true;", vec![])
        .await
        .unwrap();
    click(&b, &format!("tr[data-job=\"{}\"] input.pick", ids[0])).await;
    until(
        &b,
        "the bulk button counts the ticked job",
        &text_of("button[data-action=\"cancel-selected\"]"),
        |v| v == &json!("cancel selected (1)"),
    )
    .await;
    click(&b, "button[data-action=\"cancel-selected\"]").await;
    until(
        &b,
        "load-a shows cancelled",
        &text_of(&format!("tr[data-job=\"{}\"] .badge", ids[0])),
        |v| v == &json!("cancelled"),
    )
    .await;
    let state = |i: usize| {
        let backend = db.backend.clone();
        let (q, id) = (qj.clone(), made[i].id);
        async move { backend.job(&q, id).await.unwrap().state }
    };
    assert_eq!(state(0).await, JobState::Cancelled);
    assert_eq!(state(1).await, JobState::Ready, "only the ticked job");
    // Cancelled, it can be deleted: tick it again, delete, and its row is gone.
    click(&b, &format!("tr[data-job=\"{}\"] input.pick", ids[0])).await;
    click(
        &b,
        "button[data-action=\"delete-selected\"]:not([disabled])",
    )
    .await;
    until(&b, "load-a's row is gone", names, |v| {
        v == &json!(["load-b"])
    })
    .await;
    assert!(db.backend.job(&qj, made[0].id).await.is_err(), "deleted");
    // Every job the filter matches (load-b is left): cancelled in one action.
    click(&b, "button[data-action=\"cancel-matching\"]").await;
    until(
        &b,
        "load-b shows cancelled",
        &text_of(&format!("tr[data-job=\"{}\"] .badge", ids[1])),
        |v| v == &json!("cancelled"),
    )
    .await;
    assert_eq!(
        state(2).await,
        JobState::Ready,
        "the filter left 'other' alone"
    );
    // A scheduled job's page runs it now (SPEC M10).
    let later = db
        .backend
        .enqueue_one(NewJob::new(&qj, b"later".to_vec()).delay(Duration::from_secs(3600)))
        .await
        .unwrap()
        .id;
    b.goto(&format!("{base}/queues/{qj}/jobs/{later}"))
        .await
        .unwrap();
    click(&b, "button[data-action=\"run-now\"]").await;
    until(
        &b,
        "the scheduled job shows ready",
        &text_of("#job .badge"),
        |v| v == &json!("ready"),
    )
    .await;
    assert_eq!(
        db.backend.job(&qj, later).await.unwrap().state,
        JobState::Ready
    );

    // The workers page: the gated worker, its queue and its four slots.
    b.goto(&format!("{base}/workers")).await.unwrap();
    let wrow = "return [...document.querySelectorAll('#workers tbody tr')].map((r) => [...r.querySelectorAll('td')].slice(2, 4).map((c) => c.textContent));";
    until(&b, "the worker, its queue and slots", wrow, |v| {
        v.as_array()
            .is_some_and(|rows| rows.contains(&json!([qb, "4"])))
    })
    .await;
    screenshot(&b, "workers", screenshots).await;

    // A batch that finished with a dead job says so, not a green "finished".
    let qf = queue();
    let (batch, _) = dead_batch_job(db.backend.as_ref(), &qf).await;
    b.goto(&format!("{base}/queues/{qf}/batches"))
        .await
        .unwrap();
    until(
        &b,
        "the batch's badge counts its dead job",
        &text_of(&format!("tr[data-batch=\"{}\"] .badge", batch.id.0)),
        |v| v == &json!("finished, 1 dead"),
    )
    .await;

    // A batch whose jobs run after others draws them as a graph (SPEC D): a diamond,
    // one node per job and an arrow per edge, hostile names shown as text.
    if db.backend.limits().dependencies {
        let qg = queue();
        let graph = db
            .backend
            .open_batch(&qg, OnFailure::Continue)
            .await
            .unwrap();
        let named = |name: &str| {
            let payload = json!({ "command": "true", "name": name }).to_string();
            NewJob::new(&qg, payload.into_bytes()).in_batch(graph.id, 0)
        };
        let ids = db
            .backend
            .enqueue(vec![
                named("top"),
                named(PWN).after_call(0),
                named("right").after_call(0),
                named("join").after_call(1).after_call(2),
            ])
            .await
            .unwrap();
        b.goto(&format!("{base}/queues/{qg}/batches/{}", graph.id.0))
            .await
            .unwrap();
        let drawn = "return [document.querySelectorAll('#graph rect.node').length, document.querySelectorAll('#graph line.edge').length];";
        until(&b, "four nodes and four edges", drawn, |v| {
            v == &json!([4, 4])
        })
        .await;
        screenshot(&b, "graph", screenshots).await;
        let join = format!(
            "return document.querySelector('#graph rect[data-job=\"{}\"] ~ title')?.textContent ?? null;",
            ids[3].id
        );
        until(&b, "the join names the jobs it runs after", &join, |v| {
            v.as_str()
                .is_some_and(|t| t.contains(&format!("runs after #{}, #{}", ids[1].id, ids[2].id)))
        })
        .await;
        no_injected_markup(&b).await;
        b.goto(&format!("{base}/queues/{qg}/jobs/{}", ids[3].id))
            .await
            .unwrap();
        let after = "return [...document.querySelectorAll('#job dd a')].map((a) => a.textContent).filter((t) => t.startsWith('#'));";
        until(
            &b,
            "the job page links the jobs it runs after",
            after,
            |v| {
                v.as_array().is_some_and(|a| {
                    a.contains(&json!(format!("#{}", ids[1].id)))
                        && a.contains(&json!(format!("#{}", ids[2].id)))
                })
            },
        )
        .await;
    }

    // A schedule's page: its command shown as text, and pause from the row.
    let qs = queue();
    db.backend
        .put_schedule(
            &relayq_core::schedule::Schedule::new(&qs, "nightly", "0 2 * * *")
                .job(NewJob::new(&qs, PWN.as_bytes().to_vec())),
        )
        .await
        .unwrap();
    b.goto(&format!("{base}/queues/{qs}/schedules"))
        .await
        .unwrap();
    let srow = "[data-schedule=\"nightly\"]";
    until(
        &b,
        "the schedule's command as text",
        &text_of(&format!("{srow} pre.payload")),
        |v| v == &json!(PWN),
    )
    .await;
    no_injected_markup(&b).await;
    screenshot(&b, "schedules", screenshots).await;
    click(&b, &format!("{srow} button[data-action=\"pause\"]")).await;
    until(
        &b,
        "the schedule shows paused",
        &text_of(&format!("{srow} .badge")),
        |v| v == &json!("paused"),
    )
    .await;
    assert!(db.backend.schedules(&qs).await.unwrap()[0].paused);

    // The charts: the queue's counts sampled every 5 s while the page is open; the
    // second sample draws the lines.
    b.goto(&format!("{base}/queues/{qb}/charts")).await.unwrap();
    let lines = "return ['chart-done', 'chart-dead', 'chart-wait', 'chart-ready'].filter((id) => document.querySelector(`#${id} path.line`)).length;";
    until(&b, "four charts drawn from two samples", lines, |v| {
        v == &json!(4)
    })
    .await;
    screenshot(&b, "charts", screenshots).await;

    // The refresh can be paused from the header: the page stops asking and says so;
    // back at every second it redraws again.
    let set_rate = |ms: &str| {
        format!(
            "const r = document.querySelector('#rate'); r.value = '{ms}'; \
             r.dispatchEvent(new Event('change')); return r.value"
        )
    };
    b.execute(&set_rate("0"), vec![]).await.unwrap();
    until(&b, "status says paused", &text_of("#status"), |v| {
        v == &json!("paused")
    })
    .await;
    let updated = "return document.querySelector('#status').dataset.updated || ''";
    let paused_at = b.execute(updated, vec![]).await.unwrap();
    b.execute(&set_rate("1000"), vec![]).await.unwrap();
    until(&b, "redraws again after the pause", updated, |v| {
        v != &paused_at
    })
    .await;

    b.close().await.unwrap();
    worker.shutdown().await.unwrap();
    server.abort();
}
