//! The JSON API over a SQLite backend: counts, lists with limits, every action, and
//! the router nested under a path of the embedding service.

mod common;

use std::time::Duration;

use axum::Router;
use common::*;
use relayq_core::{ClaimRequest, EnqueueExt, JobState, NewJob, OnFailure, ProgressReport};
use relayq_dashboard::{Options, router};
use serde_json::json;

async fn app_and_csrf(db: &Db) -> (Router, String) {
    let app = router(db.backend.clone(), Options::default());
    let csrf = csrf_of(&get(&app, "/").await.body);
    (app, csrf)
}

#[tokio::test]
async fn queues_show_counts_of_every_state_and_settings() {
    let db = sqlite().await;
    let (a, b) = (queue(), queue());
    for _ in 0..2 {
        db.backend
            .enqueue_one(NewJob::new(&a, b"x".to_vec()))
            .await
            .unwrap();
    }
    dead_job(db.backend.as_ref(), &b, "p", "e").await;
    db.backend.set_max_running(&a, Some(3)).await.unwrap();
    let app = router(
        db.backend.clone(),
        Options {
            queues: vec![a.clone()],
            ..Options::default()
        },
    );
    let list = get_until(&app, &format!("/api/queues?queues={b},{a}"), counted)
        .await
        .json();
    let list = list.as_array().unwrap();
    assert_eq!(
        list.len(),
        2,
        "configured first, then the query's, each once"
    );
    assert_eq!(list[0]["queue"], a.as_str());
    assert_eq!(list[0]["counts"]["ready"], 2);
    assert_eq!(list[0]["counts"]["dead"], 0);
    assert_eq!(
        list[0]["counts"].as_object().unwrap().len(),
        JobState::ALL.len()
    );
    assert_eq!(list[0]["max_running"], 3);
    assert_eq!(list[0]["paused"], false);
    // Two ready jobs: the older one's run_at, and a wait of at least zero.
    let waited = list[0]["oldest_ready_seconds"].as_f64().unwrap();
    assert!(waited >= 0.0, "{waited}");
    assert!(list[0]["oldest_ready"].is_string(), "{}", list[0]);
    assert_eq!(list[1]["queue"], b.as_str());
    assert_eq!(list[1]["counts"]["dead"], 1);
    // Nothing waits in a queue whose only job is dead.
    assert!(list[1]["oldest_ready_seconds"].is_null(), "{}", list[1]);
    // A queue in use is listed without being configured or asked for (SPEC M4).
    let plain = get_until(&app, "/api/queues", counted).await.json();
    let names: Vec<&str> = plain
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|q| q["queue"].as_str())
        .collect();
    assert_eq!(
        names,
        [a.as_str(), b.as_str()],
        "configured first, then those in use"
    );
    let many = vec!["q"; 51].join(",");
    let answer = get(&app, &format!("/api/queues?queues={many}")).await;
    assert_eq!(
        (answer.status.as_u16(), answer.json()["field"].as_str()),
        (400, Some("queues"))
    );
}

/// A secret in a job's payload or error never reaches the page: secret-looking fields
/// and URLs' passwords are masked in the dead list and on the job's own answer.
#[tokio::test]
async fn payloads_and_errors_show_no_secret() {
    let db = sqlite().await;
    let q = queue();
    let payload = r#"{"command":"deploy","env":{"API_TOKEN":"s3cret-1","HOME":"/root"}}"#;
    let id = dead_job(
        db.backend.as_ref(),
        &q,
        payload,
        "cannot reach postgres://app:s3cret-2@db:5432/x",
    )
    .await;
    let (app, _) = app_and_csrf(&db).await;
    for uri in [
        format!("/api/queues/{q}/dead"),
        format!("/api/queues/{q}/jobs/{}", id.0),
    ] {
        let answer = get(&app, &uri).await;
        assert_eq!(answer.status.as_u16(), 200, "{uri}: {}", answer.body);
        assert!(!answer.body.contains("s3cret"), "{uri}: {}", answer.body);
        assert!(
            answer.body.contains(r#"\"API_TOKEN\":\"***\""#),
            "{uri}: {}",
            answer.body
        );
        assert!(
            answer.body.contains("postgres://app:***@db:5432/x"),
            "{uri}: {}",
            answer.body
        );
        assert!(
            answer.body.contains("/root"),
            "{uri}: other fields stay: {}",
            answer.body
        );
    }
}

#[tokio::test]
async fn lists_take_a_limit_and_say_when_more_exist() {
    let db = sqlite().await;
    let q = queue();
    for i in 0..3 {
        dead_job(db.backend.as_ref(), &q, &format!("job {i}"), "boom").await;
    }
    let (app, _) = app_and_csrf(&db).await;
    let page = get(&app, &format!("/api/queues/{q}/dead?limit=2"))
        .await
        .json();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["more"], true);
    assert_eq!(page["items"][0]["payload"], "job 0");
    let page = get(&app, &format!("/api/queues/{q}/dead?limit=3"))
        .await
        .json();
    assert_eq!(
        (page["items"].as_array().unwrap().len(), &page["more"]),
        (3, &false.into())
    );
    for bad in ["0", "1001", "x", "-1"] {
        for list in ["dead", "running", "batches"] {
            let answer = get(&app, &format!("/api/queues/{q}/{list}?limit={bad}")).await;
            assert_eq!(answer.status, 400, "{list} {bad}");
            assert_eq!(answer.json()["field"], "limit");
        }
    }
}

#[tokio::test]
async fn batches_and_running_jobs_are_listed() {
    let db = sqlite().await;
    let q = queue();
    let batch = db.backend.open_batch(&q, OnFailure::Halt).await.unwrap();
    db.backend
        .enqueue(vec![
            NewJob::new(&q, b"a".to_vec()).in_batch(batch.id, 1),
            NewJob::new(&q, b"b".to_vec()).in_batch(batch.id, 2),
        ])
        .await
        .unwrap();
    db.backend.seal(&batch).await.unwrap();
    let claimed = db
        .backend
        .claim(ClaimRequest::new(
            &q,
            "worker-7",
            10,
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "stage 2 waits for stage 1");
    let report = ProgressReport {
        lease: claimed[0].lease.clone(),
        percent: 40,
        message: "copying from postgres://app:s3cret@db/x".into(),
    };
    assert!(
        db.backend
            .report_progress(&[report])
            .await
            .unwrap()
            .is_empty()
    );
    let (app, _) = app_and_csrf(&db).await;

    let batches = get(&app, &format!("/api/queues/{q}/batches")).await.json();
    let stages = &batches["items"][0]["stages"];
    assert_eq!(batches["items"][0]["batch"]["id"], batch.id.0);
    assert_eq!(
        (stages[0]["stage"].as_i64(), stages[0]["running"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (stages[1]["stage"].as_i64(), stages[1]["pending"].as_u64()),
        (Some(2), Some(1))
    );
    let one = get(&app, &format!("/api/queues/{q}/batches/{}", batch.id.0))
        .await
        .json();
    assert_eq!(one["stages"], *stages);

    let running = get(&app, &format!("/api/queues/{q}/running")).await.json();
    let job = &running["items"][0];
    assert_eq!(job["id"], claimed[0].id().0);
    assert_eq!(job["worker"], "worker-7");
    assert_eq!(job["attempt"], 1);
    assert!(job["lease_expires_at"].is_string());
    // Its progress, the URL's password masked, here and on the job's page.
    assert_eq!(job["progress"]["percent"], 40);
    assert_eq!(
        job["progress"]["message"],
        "copying from postgres://app:***@db/x"
    );
    let page = get(&app, &format!("/api/queues/{q}/jobs/{}", claimed[0].id().0))
        .await
        .json();
    assert_eq!(page["progress"], job["progress"]);
    assert_eq!(page["result"], serde_json::Value::Null);

    // The batch's jobs for its timeline, page by page: the running one with its
    // attempt, then the one waiting on stage 2, with none.
    let jobs = |tail: &str| format!("/api/queues/{q}/batches/{}/jobs{tail}", batch.id.0);
    let first = get(&app, &jobs("?limit=1")).await.json();
    assert_eq!(first["more"], true);
    assert_eq!(
        first["next"],
        json!(claimed[0].id().0),
        "the next page's cursor"
    );
    let item = &first["items"][0];
    assert_eq!(
        (&item["id"], &item["stage"], &item["state"]),
        (&json!(claimed[0].id().0), &json!(1), &json!("running"))
    );
    assert_eq!(item["attempt_log"][0]["worker"], "worker-7");
    assert_eq!(item["attempt_log"][0]["outcome"], "running");
    assert!(
        item.get("payload").is_none(),
        "the timeline needs no payload"
    );
    let rest = get(
        &app,
        &jobs(&format!("?limit=1&after={}", claimed[0].id().0)),
    )
    .await
    .json();
    assert_eq!(
        (&rest["more"], &rest["next"]),
        (&json!(false), &json!(null))
    );
    assert_eq!(rest["items"][0]["stage"], 2);
    assert_eq!(rest["items"][0]["attempt_log"], json!([]));
    let bad = get(&app, &jobs("?after=x")).await;
    assert_eq!(
        (bad.status.as_u16(), bad.json()["field"].clone()),
        (400, json!("after"))
    );
    let unknown = get(&app, &format!("/api/queues/{q}/batches/999999/jobs")).await;
    assert_eq!(unknown.status.as_u16(), 404);
}

#[tokio::test]
async fn actions_pause_limit_cancel_and_retry() {
    let db = sqlite().await;
    let q = queue();
    let (app, csrf) = app_and_csrf(&db).await;
    let stats = || async { db.backend.queue_stats(&q).await.unwrap() };

    assert_eq!(
        post(&app, &format!("/api/queues/{q}/pause"), &csrf, "")
            .await
            .status,
        200
    );
    assert!(stats().await.paused);
    assert_eq!(
        post(&app, &format!("/api/queues/{q}/resume"), &csrf, "")
            .await
            .status,
        200
    );
    assert!(!stats().await.paused);

    let max = format!("/api/queues/{q}/max-running");
    assert_eq!(
        post(&app, &max, &csrf, r#"{"max_running": 4}"#)
            .await
            .status,
        200
    );
    assert_eq!(stats().await.max_running, Some(4));
    let bad = post(&app, &max, &csrf, r#"{"max_running": 0}"#).await;
    assert_eq!(
        (bad.status.as_u16(), bad.json()["field"].as_str()),
        (400, Some("max_running"))
    );
    assert_eq!(stats().await.max_running, Some(4));
    assert_eq!(
        post(&app, &max, &csrf, r#"{"max_running": null}"#)
            .await
            .status,
        200
    );
    assert_eq!(stats().await.max_running, None);

    let job = db
        .backend
        .enqueue_one(NewJob::new(&q, b"x".to_vec()))
        .await
        .unwrap()
        .id;
    let answer = post(
        &app,
        &format!("/api/queues/{q}/jobs/{}/cancel", job.0),
        &csrf,
        "",
    )
    .await;
    assert_eq!(answer.json()["cancelled"], true);
    assert_eq!(
        db.backend.job(&q, job).await.unwrap().state,
        JobState::Cancelled
    );

    let batch = db
        .backend
        .open_batch(&q, OnFailure::Continue)
        .await
        .unwrap();
    db.backend
        .enqueue(vec![NewJob::new(&q, b"y".to_vec()).in_batch(batch.id, 0)])
        .await
        .unwrap();
    let answer = post(
        &app,
        &format!("/api/queues/{q}/batches/{}/cancel", batch.id.0),
        &csrf,
        "",
    )
    .await;
    assert_eq!(answer.json()["cancelled"], 1);

    let first = dead_job(db.backend.as_ref(), &q, "d1", "e").await;
    dead_job(db.backend.as_ref(), &q, "d2", "e").await;
    dead_job(db.backend.as_ref(), &q, "d3", "e").await;
    let answer = post(
        &app,
        &format!("/api/queues/{q}/jobs/{}/retry", first.0),
        &csrf,
        "",
    )
    .await;
    assert_eq!(answer.json()["retried"], 1);
    assert_eq!(
        db.backend.job(&q, first).await.unwrap().state,
        JobState::Ready
    );
    let answer = post(&app, &format!("/api/queues/{q}/dead/retry"), &csrf, "").await;
    assert_eq!(answer.json()["retried"], 2);
    assert_eq!(answer.json()["stayed"], 0);
    assert!(answer.json()["note"].is_null(), "{}", answer.body);
    assert_eq!(stats().await.count(JobState::Dead), 0);
    assert_eq!(stats().await.count(JobState::Ready), 3);

    // A dead job of a batch stays dead, and retry all says so instead of "0 retried".
    let other = queue();
    dead_batch_job(db.backend.as_ref(), &other).await;
    let answer = post(&app, &format!("/api/queues/{other}/dead/retry"), &csrf, "").await;
    let out = answer.json();
    assert_eq!(
        (out["retried"].clone(), out["stayed"].clone()),
        (json!(0), json!(1)),
        "{out}"
    );
    assert_eq!(out["stayed_in_batches"], 1, "{out}");
    assert!(
        out["note"]
            .as_str()
            .is_some_and(|n| n.contains("in batches")),
        "{out}"
    );

    let unknown = post(
        &app,
        &format!("/api/queues/{q}/jobs/987654/cancel"),
        &csrf,
        "",
    )
    .await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test]
async fn a_nested_router_links_under_its_mount_path() {
    let db = sqlite().await;
    let q = queue();
    let app = Router::new().nest(
        "/ops/relayq",
        router(db.backend.clone(), Options::default()),
    );
    let page = get(&app, &format!("/ops/relayq/queues/{q}/dead")).await;
    assert_eq!(page.status, 200);
    assert_eq!(meta_of(&page.body, "base"), "/ops/relayq");
    assert!(page.body.contains(r#"src="/ops/relayq/assets/app.js""#));
    assert_eq!(get(&app, "/ops/relayq/assets/app.js").await.status, 200);
    assert_eq!(get(&app, "/ops/relayq").await.status, 200);
    let api = get(&app, &format!("/ops/relayq/api/queues/{q}")).await;
    assert_eq!(api.json()["queue"], q.as_str());
    let csrf = csrf_of(&page.body);
    assert_eq!(
        post(
            &app,
            &format!("/ops/relayq/api/queues/{q}/pause"),
            &csrf,
            ""
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn schedules_are_listed_paused_resumed_and_run_now() {
    use relayq_core::schedule::Schedule;
    let db = sqlite().await;
    let q = queue();
    let name = "night ly <b>";
    db.backend
        .put_schedule(
            &Schedule::new(&q, name, "0 2 * * *")
                .time_zone("Europe/Berlin")
                .job(NewJob::new(
                    &q,
                    br#"{"command": "report", "password": "hunter2"}"#.to_vec(),
                )),
        )
        .await
        .unwrap();
    let (app, csrf) = app_and_csrf(&db).await;
    let list = get(&app, &format!("/api/queues/{q}/schedules"))
        .await
        .json();
    let s = &list[0];
    assert_eq!(s["name"], name);
    assert_eq!(
        (s["cron"].as_str(), s["time_zone"].as_str()),
        (Some("0 2 * * *"), Some("Europe/Berlin"))
    );
    assert_eq!(s["paused"], false);
    assert!(s["next_slot"].is_string(), "{s}");
    let makes = s["makes"].as_str().unwrap();
    assert!(
        makes.contains("report") && !makes.contains("hunter2"),
        "secrets masked: {makes}"
    );

    let path = |what: &str| format!("/api/queues/{q}/schedules/night%20ly%20%3Cb%3E/{what}");
    assert_eq!(post(&app, &path("pause"), &csrf, "").await.status, 200);
    let list = get(&app, &format!("/api/queues/{q}/schedules"))
        .await
        .json();
    assert_eq!(list[0]["paused"], true);
    assert!(
        list[0]["next_slot"].is_null(),
        "a paused schedule has no next slot"
    );

    let ran = post(&app, &path("run-now"), &csrf, "").await;
    assert_eq!(ran.status, 200);
    let job = ran.json()["jobs"][0].as_i64().expect("a job id");
    let info = db.backend.job(&q, relayq_core::JobId(job)).await.unwrap();
    assert_eq!(
        info.enqueued_by.as_deref(),
        Some(format!("schedule {name}").as_str())
    );

    assert_eq!(post(&app, &path("resume"), &csrf, "").await.status, 200);
    assert!(!db.backend.schedules(&q).await.unwrap()[0].paused);
    let missing = post(
        &app,
        &format!("/api/queues/{q}/schedules/nope/pause"),
        &csrf,
        "",
    )
    .await;
    assert_eq!(missing.status, 404);
    let forged = post(&app, &path("pause"), "not-the-token", "").await;
    assert_eq!(forged.status, 403, "actions need the CSRF token");
    assert!(!db.backend.schedules(&q).await.unwrap()[0].paused);
}

#[tokio::test]
async fn a_jobs_why_names_what_holds_it() {
    let db = sqlite().await;
    let q = queue();
    let later = db
        .backend
        .enqueue_one(NewJob::new(&q, b"x".to_vec()).delay(Duration::from_secs(3600)))
        .await
        .unwrap()
        .id;
    let (app, _) = app_and_csrf(&db).await;
    let why = get(&app, &format!("/api/queues/{q}/jobs/{}/why", later.0))
        .await
        .json();
    let lines = why["why"].as_array().expect("a list of lines");
    assert_eq!(lines.len(), 1, "{why}");
    assert!(
        lines[0].as_str().unwrap().starts_with("not before "),
        "{why}"
    );
    let missing = get(&app, &format!("/api/queues/{q}/jobs/999999/why")).await;
    assert_eq!(missing.status, 404);
}

/// The ids of a jobs page.
fn ids_of(page: &serde_json::Value) -> Vec<i64> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect()
}

/// SPEC M7 through the API: any job found by state, batch, group or text, newest
/// first, page by page, each with its name (secrets masked); bad filters name their
/// field; the running list names each job, its batch and stage.
#[tokio::test]
async fn jobs_are_found_by_filter_page_by_page() {
    let db = sqlite().await;
    let q = queue();
    let b = db.backend.as_ref();
    // First: `dead_job` fails whichever job a claim takes next.
    let dead = dead_job(b, &q, "plain", "disk full").await;
    let batch = b.open_batch(&q, OnFailure::Continue).await.unwrap();
    let staged = b
        .enqueue(vec![
            NewJob::new(&q, br#"{"name":"load orders","command":"x"}"#.to_vec())
                .in_batch(batch.id, 1),
            NewJob::new(
                &q,
                br#"{"command":"psql postgres://u:s3cret@db/x"}"#.to_vec(),
            )
            .in_batch(batch.id, 2)
            .group("g"),
        ])
        .await
        .unwrap();
    let ready: Vec<i64> = b
        .enqueue(
            (0..3)
                .map(|i| NewJob::new(&q, format!("r{i}").into_bytes()))
                .collect(),
        )
        .await
        .unwrap()
        .iter()
        .map(|e| e.id.0)
        .collect();
    let claimed = b
        .claim(ClaimRequest::new(
            &q,
            "worker-9",
            1,
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(claimed[0].id(), staged[0].id, "stage 1 first");
    let (app, _) = app_and_csrf(&db).await;
    let list = |tail: &str| {
        let app = app.clone();
        let uri = format!("/api/queues/{q}/jobs{tail}");
        async move { get(&app, &uri).await }
    };

    let all = list("?limit=2").await.json();
    assert_eq!(ids_of(&all), [ready[2], ready[1]]);
    let next = all["next"].as_i64().unwrap();
    let rest = list(&format!("?limit=1000&before={next}")).await.json();
    assert_eq!(
        ids_of(&rest),
        [ready[0], staged[1].id.0, staged[0].id.0, dead.0]
    );
    assert!(rest["next"].is_null());
    for (tail, want) in [
        ("?state=dead", vec![dead.0]),
        ("?state=blocked", vec![staged[1].id.0]),
        (
            &format!("?batch={}&stage=1", batch.id.0) as &str,
            vec![staged[0].id.0],
        ),
        ("?group=g", vec![staged[1].id.0]),
        ("?text=disk", vec![dead.0]),
        ("?text=load%20orders&state=", vec![staged[0].id.0]),
    ] {
        assert_eq!(ids_of(&list(tail).await.json()), want, "{tail}");
    }
    let page = list("?state=running").await.json();
    let row = &page["items"][0];
    assert_eq!(
        (&row["name"], &row["worker"], &row["batch"], &row["stage"]),
        (
            &json!("load orders"),
            &json!("worker-9"),
            &json!(batch.id.0),
            &json!(1)
        )
    );
    let masked = list("?group=g").await;
    assert!(!masked.body.contains("s3cret"), "{}", masked.body);
    assert!(
        masked.body.contains("postgres://u:***@db/x"),
        "{}",
        masked.body
    );
    // The text filter finds what a person may read, not a masked secret: typed a
    // character at a time it would spell the secret out.
    assert!(ids_of(&list("?text=s3cret").await.json()).is_empty());
    assert!(ids_of(&list("?text=u:s").await.json()).is_empty());
    assert_eq!(ids_of(&list("?text=psql").await.json()), [staged[1].id.0]);
    assert_eq!(
        list("?state=dead").await.json()["items"][0]["error"],
        "disk full"
    );
    for (tail, field) in [
        ("?state=asleep", "state"),
        ("?batch=x", "batch"),
        ("?stage=1.5", "stage"),
        ("?before=y", "before"),
        ("?limit=0", "limit"),
    ] {
        let answer = list(tail).await;
        assert_eq!(
            (answer.status.as_u16(), answer.json()["field"].as_str()),
            (400, Some(field)),
            "{tail}"
        );
    }

    let running = get(&app, &format!("/api/queues/{q}/running")).await.json();
    let row = &running["items"][0];
    assert_eq!(
        (&row["name"], &row["batch"], &row["stage"], &row["worker"]),
        (
            &json!("load orders"),
            &json!(batch.id.0),
            &json!(1),
            &json!("worker-9")
        )
    );
}

/// Bulk actions: cancel the selected jobs, retry the selected dead ones, and act on
/// every job a filter matches; each answer counts what it changed and says what it
/// left alone; bad bodies name their field and change nothing.
#[tokio::test]
async fn bulk_actions_cancel_and_retry_selected_or_matching() {
    let db = sqlite().await;
    let q = queue();
    let b = db.backend.as_ref();
    let (app, csrf) = app_and_csrf(&db).await;
    let bulk = format!("/api/queues/{q}/jobs/bulk");
    let ready: Vec<i64> = b
        .enqueue(
            (0..4)
                .map(|i| NewJob::new(&q, format!("job {i}").into_bytes()))
                .collect(),
        )
        .await
        .unwrap()
        .iter()
        .map(|e| e.id.0)
        .collect();
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "cancel", "ids": [ready[0], ready[1]]}).to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        (
            answer.json()["cancelled"].as_u64(),
            answer.json()["unchanged"].as_u64()
        ),
        (Some(2), Some(0))
    );
    let qr = &q;
    let state = |id: i64| async move { b.job(qr, relayq_core::JobId(id)).await.unwrap().state };
    assert_eq!(state(ready[0]).await, JobState::Cancelled);
    assert_eq!(state(ready[2]).await, JobState::Ready);
    // Again: both are finished now, and the answer says so.
    let again = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "cancel", "ids": [ready[0], ready[1]]}).to_string(),
    )
    .await
    .json();
    assert_eq!(again["unchanged"], 2);
    assert!(
        again["note"].as_str().unwrap().contains("already finished"),
        "{again}"
    );

    // An id that no longer exists (pruned, deleted) is left as it is, not an error.
    let gone = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "cancel", "ids": [ready[2] + 1_000_000]}).to_string(),
    )
    .await;
    assert_eq!(gone.status, 200, "{}", gone.body);
    assert_eq!(gone.json()["unchanged"], 1);

    // Every job matching a filter: "job 3" only.
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "cancel", "filter": {"text": "job 3", "state": "ready"}}).to_string(),
    )
    .await
    .json();
    assert_eq!(
        (answer["cancelled"].as_u64(), answer["more"].as_bool()),
        (Some(1), Some(false))
    );
    assert_eq!(state(ready[3]).await, JobState::Cancelled);
    assert_eq!(state(ready[2]).await, JobState::Ready);

    // Retry, in a queue of its own (`dead_job` fails whichever job comes next): the
    // selected dead job, then every dead one by filter.
    let q = queue();
    let qr = &q;
    let state = |id: i64| async move { b.job(qr, relayq_core::JobId(id)).await.unwrap().state };
    let bulk = format!("/api/queues/{q}/jobs/bulk");
    let d1 = dead_job(b, &q, "d1", "boom").await.0;
    let d2 = dead_job(b, &q, "d2", "boom").await.0;
    let other = b
        .enqueue_one(NewJob::new(&q, b"ready".to_vec()))
        .await
        .unwrap()
        .id
        .0;
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "retry", "ids": [d1, other]}).to_string(),
    )
    .await
    .json();
    assert_eq!(
        (answer["retried"].as_u64(), answer["unchanged"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(state(d1).await, JobState::Ready);
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "retry", "filter": {"text": "boom"}}).to_string(),
    )
    .await
    .json();
    assert_eq!(answer["retried"], 1, "{answer}");
    assert_eq!(state(d2).await, JobState::Ready);

    // Delete: a finished job goes, an unfinished one stays and the answer says why.
    let done = b
        .enqueue_one(NewJob::new(&q, b"gone".to_vec()))
        .await
        .unwrap()
        .id;
    b.cancel_job(&q, done).await.unwrap();
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "delete", "ids": [done.0, d1]}).to_string(),
    )
    .await
    .json();
    assert_eq!(
        (answer["deleted"].as_u64(), answer["unchanged"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        answer["note"]
            .as_str()
            .unwrap()
            .contains("cancel them first"),
        "{answer}"
    );
    assert!(b.job(&q, done).await.is_err(), "the cancelled job is gone");
    assert_eq!(state(d1).await, JobState::Ready);

    // Run now (SPEC M10): a scheduled job becomes due; a ready one is left, and the
    // answer says why.
    let later = b
        .enqueue_one(NewJob::new(&q, b"later".to_vec()).delay(std::time::Duration::from_secs(3600)))
        .await
        .unwrap()
        .id;
    assert_eq!(state(later.0).await, JobState::Scheduled);
    let answer = post(
        &app,
        &bulk,
        &csrf,
        &json!({"action": "run_now", "ids": [later.0, d1]}).to_string(),
    )
    .await
    .json();
    assert_eq!(
        (answer["due_now"].as_u64(), answer["unchanged"].as_u64()),
        (Some(1), Some(1)),
        "{answer}"
    );
    assert!(
        answer["note"].as_str().unwrap().contains("due already"),
        "{answer}"
    );
    assert_eq!(state(later.0).await, JobState::Ready);

    for (body, field) in [
        (json!({"action": "cancel"}), "ids"),
        (json!({"action": "cancel", "ids": []}), "ids"),
        (json!({"action": "explode", "ids": [d1]}), "body"),
        (
            json!({"action": "cancel", "filter": {"batch": "x"}}),
            "batch",
        ),
    ] {
        let answer = post(&app, &bulk, &csrf, &body.to_string()).await;
        assert_eq!(
            (answer.status.as_u16(), answer.json()["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
    assert_eq!(
        state(d1).await,
        JobState::Ready,
        "a refused action changed nothing"
    );
    // Without the page's CSRF token, nothing happens.
    let forged = post(
        &app,
        &bulk,
        "wrong",
        &json!({"action": "cancel", "ids": [d1]}).to_string(),
    )
    .await;
    assert_eq!(forged.status, 403);
    assert_eq!(state(d1).await, JobState::Ready);
}

/// SPEC M9 through the API: a queue's workers, every worker once across queues, and
/// the count of live ones on the queue's own answer.
#[tokio::test]
async fn workers_are_listed_from_their_beats() {
    let db = sqlite().await;
    let (a, c) = (queue(), queue());
    db.backend
        .enqueue_one(NewJob::new(&a, b"x".to_vec()))
        .await
        .unwrap();
    let (app, _) = app_and_csrf(&db).await;
    let view = get_until(&app, &format!("/api/queues/{a}"), counted)
        .await
        .json();
    assert_eq!(view["workers"], 0, "nobody serves {a} yet");
    let beat = |queues: Vec<String>| relayq_core::WorkerBeat {
        worker: "w-1".into(),
        host: "box".into(),
        pid: 9,
        queues,
        slots: 4,
        busy: 1,
        held: 3,
        started_at: chrono::Utc::now(),
    };
    let both = vec![a.clone(), c.clone()];
    db.backend
        .worker_beat(&a, &beat(both.clone()))
        .await
        .unwrap();
    db.backend
        .worker_beat(&c, &beat(both.clone()))
        .await
        .unwrap();
    let view = get(&app, &format!("/api/queues/{a}")).await.json();
    assert_eq!(view["workers"], 1);
    assert_eq!(view["held"], 3, "jobs claimed ahead, by the beat: {view}");
    let of_a = get(&app, &format!("/api/queues/{a}/workers")).await.json();
    assert_eq!(of_a[0]["worker"], "w-1");
    assert_eq!(
        (of_a[0]["slots"].as_u64(), of_a[0]["alive"].as_bool()),
        (Some(4), Some(true))
    );
    let all = get(&app, &format!("/api/workers?queues={c}")).await.json();
    assert_eq!(
        all.as_array().unwrap().len(),
        1,
        "one row per worker: {all}"
    );
    assert_eq!(all[0]["queues"], json!(both));
}

/// The charts' samples: a count of the queue is one; a second within 5 s is not kept.
#[tokio::test]
async fn history_samples_the_counts() {
    let db = sqlite().await;
    let q = queue();
    db.backend
        .enqueue_one(NewJob::new(&q, b"x".to_vec()))
        .await
        .unwrap();
    let (app, _) = app_and_csrf(&db).await;
    let first = get_until(&app, &format!("/api/queues/{q}/history"), |a| {
        a.status == 200
            && a.json()["samples"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
    })
    .await
    .json();
    assert_eq!(first["every_seconds"], 5);
    let samples = first["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 1, "{first}");
    assert_eq!(
        (
            samples[0]["ready"].as_u64(),
            samples[0]["succeeded"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let again = get(&app, &format!("/api/queues/{q}/history")).await.json();
    assert_eq!(
        again["samples"].as_array().unwrap().len(),
        1,
        "a second count within 5 s"
    );
}

/// `GET /api/queues/{q}/keys` gives each limit key's running count and limit.
#[tokio::test]
async fn limit_keys_show_their_running_jobs_and_limits() {
    let db = sqlite().await;
    let q = queue();
    db.backend.set_key_limit(&q, None, Some(2)).await.unwrap();
    db.backend
        .set_key_limit(&q, Some("db <a>"), Some(1))
        .await
        .unwrap();
    db.backend
        .enqueue_one(NewJob::new(&q, b"x".to_vec()).limit_key("db <a>"))
        .await
        .unwrap();
    let got = db
        .backend
        .claim(ClaimRequest::new(&q, "w", 5, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let (app, _) = app_and_csrf(&db).await;
    let keys = get(&app, &format!("/api/queues/{q}/keys")).await.json();
    assert_eq!(keys["default"], 2, "{keys}");
    assert_eq!(
        keys["keys"],
        json!([{"key": "db <a>", "running": 1, "own": 1, "limit": 1,
                "own_rate": null, "rate": null, "rate_next": null}]),
        "{keys}"
    );
}

/// `GET /api/queues/{q}/keys` gives the default key rate, each key's rate as text, and
/// when a key whose rate allows no start now allows its next (SPEC K14).
#[tokio::test]
async fn limit_keys_show_their_rates_and_next_starts() {
    let db = sqlite().await;
    let q = queue();
    let hour = Duration::from_secs(3600);
    db.backend
        .set_key_rate(&q, None, Some(relayq_core::Rate::new(5, hour)))
        .await
        .unwrap();
    db.backend
        .set_key_rate(&q, Some("db <a>"), Some(relayq_core::Rate::new(1, hour)))
        .await
        .unwrap();
    for _ in 0..2 {
        db.backend
            .enqueue_one(NewJob::new(&q, b"x".to_vec()).limit_key("db <a>"))
            .await
            .unwrap();
    }
    let got = db
        .backend
        .claim(ClaimRequest::new(&q, "w", 5, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the key's rate of 1/1h starts one");
    let (app, _) = app_and_csrf(&db).await;
    let keys = get(&app, &format!("/api/queues/{q}/keys")).await.json();
    assert_eq!(keys["default_rate"], "5/1h", "{keys}");
    let key = &keys["keys"][0];
    assert_eq!(
        (&key["key"], &key["own_rate"], &key["rate"]),
        (&json!("db <a>"), &json!("1/1h"), &json!("1/1h")),
        "{keys}"
    );
    let next: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(key["rate_next"].clone()).expect("a next start");
    let ahead = next - chrono::Utc::now();
    assert!(
        ahead > chrono::TimeDelta::minutes(59) && ahead <= chrono::TimeDelta::hours(1),
        "the next start is {ahead} ahead"
    );
}

/// `GET /api/queues/{q}` gives the queue's rate and, once it allows no start, when it
/// allows the next (SPEC K8, K11).
#[tokio::test]
async fn a_queue_shows_its_rate_and_next_start() {
    let db = sqlite().await;
    let q = queue();
    let rate = relayq_core::Rate::new(2, Duration::from_secs(3600)).with_burst(2);
    db.backend
        .update_queue(&q, relayq_core::QueueUpdate::default().rate(Some(rate)))
        .await
        .unwrap();
    for _ in 0..3 {
        db.backend
            .enqueue_one(NewJob::new(&q, b"x".to_vec()))
            .await
            .unwrap();
    }
    let got = db
        .backend
        .claim(ClaimRequest::new(&q, "w", 5, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(got.len(), 2, "the rate's burst");
    let (app, _) = app_and_csrf(&db).await;
    let view = get(&app, &format!("/api/queues/{q}")).await.json();
    assert_eq!(view["rate"], "2/1h burst 2", "{view}");
    assert!(view["rate_next"].is_string(), "{view}");
}
