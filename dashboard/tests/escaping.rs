//! Hostile text in payloads, errors, output and worker names reaches the browser only
//! as JSON data; no page carries it, and bad names in URLs are refused by field.

mod common;

use common::*;
use relayq_dashboard::{Options, router};

#[tokio::test]
async fn api_returns_hostile_text_as_data() {
    let db = sqlite().await;
    let q = queue();
    let id = dead_job(db.backend.as_ref(), &q, HOSTILE, HOSTILE).await;
    let app = router(db.backend.clone(), Options::default());

    let dead = get(&app, &format!("/api/queues/{q}/dead")).await;
    assert_eq!(dead.status, 200, "{}", dead.body);
    assert!(
        dead.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let dead = dead.json();
    let job = &dead["items"][0];
    assert_eq!(job["id"], id.0);
    assert_eq!(job["payload"], HOSTILE);
    assert_eq!(job["last_error"], HOSTILE);
    assert_eq!(
        job["attempt_log"][0]["output"],
        format!("output: {HOSTILE}")
    );
    assert_eq!(job["attempt_log"][0]["worker"], "w<1>");

    let one = get(&app, &format!("/api/queues/{q}/jobs/{}", id.0))
        .await
        .json();
    assert_eq!(one["payload"], HOSTILE);
    assert_eq!(one["attempt_log"][0]["error"], HOSTILE);
}

#[tokio::test]
async fn pages_never_carry_stored_text() {
    let db = sqlite().await;
    let q = queue();
    let id = dead_job(db.backend.as_ref(), &q, HOSTILE, HOSTILE).await;
    let app = router(
        db.backend.clone(),
        Options {
            queues: vec![q.clone()],
            ..Options::default()
        },
    );
    for path in [
        "/".to_owned(),
        format!("/queues/{q}/dead"),
        format!("/queues/{q}/running"),
        format!("/queues/{q}/batches"),
        format!("/queues/{q}/jobs/{}", id.0),
    ] {
        let page = get(&app, &path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains("alert("), "{path}: {}", page.body);
        assert!(!page.body.contains("<img"), "{path}");
        // The CSP forbids inline scripts: text that slipped in as markup would not run.
        let csp = page.headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    }
    // The script that draws the data sets it as text, never as markup.
    let js = get(&app, "/assets/app.js").await.body;
    assert!(
        !js.contains(".innerHTML")
            && !js.contains("outerHTML")
            && !js.contains("insertAdjacentHTML")
    );
    assert!(js.contains("textContent") && js.contains("createTextNode"));
}

#[tokio::test]
async fn hostile_names_in_urls_are_refused_by_field() {
    let db = sqlite().await;
    let app = router(db.backend.clone(), Options::default());
    for path in [
        "/queues/%3Cscript%3Ealert(1)%3C%2Fscript%3E/dead",
        "/api/queues/%3Cscript%3E/dead",
        "/api/queues?queues=ok,%3Cscript%3E",
    ] {
        let answer = get(&app, path).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.json()["field"], "queue", "{path}");
        assert!(
            !answer.headers["content-type"]
                .to_str()
                .unwrap()
                .contains("html")
        );
    }
    let q = queue();
    let answer = get(&app, &format!("/queues/{q}/jobs/%3Cb%3E")).await;
    assert_eq!(
        (answer.status.as_u16(), answer.json()["field"].as_str()),
        (400, Some("job"))
    );
    let answer = get(&app, &format!("/api/queues/{q}/batches/x1")).await;
    assert_eq!(
        (answer.status.as_u16(), answer.json()["field"].as_str()),
        (400, Some("batch"))
    );
    let answer = get(&app, &format!("/api/queues/{q}/jobs/999999")).await;
    assert_eq!(answer.status, 404);
}
