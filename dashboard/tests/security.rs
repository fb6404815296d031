//! CSRF and same-origin on every action, read-only without actions, the token on
//! every request.

mod common;

use axum::{
    body::Body,
    http::{Method, Request},
};
use common::*;
use relayq_dashboard::{Options, router};

const ACTIONS: [&str; 7] = [
    "pause",
    "resume",
    "max-running",
    "jobs/1/cancel",
    "jobs/1/retry",
    "batches/1/cancel",
    "dead/retry",
];

/// GETs `uri` as a browser opening a page does.
async fn page(app: &axum::Router, uri: &str) -> Answer {
    send(
        app,
        Request::get(uri)
            .header("accept", "text/html")
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

fn raw_post(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::builder().method(Method::POST).uri(uri);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.body(Body::from("{}")).unwrap()
}

#[tokio::test]
async fn actions_without_the_csrf_token_or_from_another_origin_are_403() {
    let db = sqlite().await;
    let q = queue();
    let app = router(db.backend.clone(), Options::default());
    let csrf = csrf_of(&get(&app, "/").await.body);
    assert_eq!(csrf.len(), 64);
    let pause = format!("/api/queues/{q}/pause");

    let cases: [(&str, Vec<(&str, &str)>); 5] = [
        (
            "no token",
            vec![("host", "127.0.0.1:1"), ("origin", "http://127.0.0.1:1")],
        ),
        (
            "wrong token",
            vec![("x-relayq-csrf", "0000"), ("host", "127.0.0.1:1")],
        ),
        (
            "cross-site fetch",
            vec![("x-relayq-csrf", &csrf), ("sec-fetch-site", "cross-site")],
        ),
        (
            "same-site, other origin",
            vec![("x-relayq-csrf", &csrf), ("sec-fetch-site", "same-site")],
        ),
        (
            "other Origin",
            vec![
                ("x-relayq-csrf", &csrf),
                ("host", "127.0.0.1:1"),
                ("origin", "http://evil.example"),
            ],
        ),
    ];
    for (what, headers) in cases {
        let answer = send(&app, raw_post(&pause, &headers)).await;
        assert_eq!(answer.status, 403, "{what}: {}", answer.body);
        assert!(!db.backend.queue_stats(&q).await.unwrap().paused, "{what}");
    }
    for action in ACTIONS {
        let answer = send(&app, raw_post(&format!("/api/queues/{q}/{action}"), &[])).await;
        assert_eq!(answer.status, 403, "{action}");
    }

    // The page's own request: the token, same origin.
    let answer = post(&app, &pause, &csrf, "").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(db.backend.queue_stats(&q).await.unwrap().paused);

    // Another router (another process) does not take this one's token.
    let other = router(db.backend.clone(), Options::default());
    let answer = post(&other, &format!("/api/queues/{q}/resume"), &csrf, "").await;
    assert_eq!(answer.status, 403);
}

#[tokio::test]
async fn read_only_has_no_action_routes_and_no_token_in_pages() {
    let db = sqlite().await;
    let q = queue();
    let app = router(
        db.backend.clone(),
        Options {
            read_only: true,
            queues: vec![q.clone()],
            ..Options::default()
        },
    );
    let page = get(&app, &format!("/queues/{q}/dead")).await.body;
    assert_eq!(meta_of(&page, "read-only"), "true");
    assert_eq!(csrf_of(&page), "");
    // Even the token of a writable router in the same process does not help.
    let writable = router(db.backend.clone(), Options::default());
    let csrf = csrf_of(&get(&writable, "/").await.body);
    for action in ACTIONS {
        let answer = post(&app, &format!("/api/queues/{q}/{action}"), &csrf, "{}").await;
        assert!(
            answer.status == 404 || answer.status == 405,
            "{action}: {}",
            answer.status
        );
    }
    assert!(!db.backend.queue_stats(&q).await.unwrap().paused);
    // Reading still works.
    assert_eq!(get(&app, &format!("/api/queues/{q}")).await.status, 200);
}

#[tokio::test]
async fn with_a_token_every_request_needs_it() {
    let db = sqlite().await;
    let q = queue();
    let token = "s3cret-t0ken";
    let app = router(
        db.backend.clone(),
        Options {
            token: Some(token.into()),
            ..Options::default()
        },
    );
    for path in [
        "/".to_owned(),
        format!("/queues/{q}/dead"),
        "/assets/app.js".to_owned(),
        "/api/queues".to_owned(),
        format!("/api/queues/{q}/running"),
        "/metrics".to_owned(),
    ] {
        let answer = get(&app, &path).await;
        assert_eq!(answer.status, 401, "{path}");
        assert!(!answer.body.contains(token));
        let wrong = send(
            &app,
            Request::get(&path)
                .header("authorization", "Bearer nope")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(wrong.status, 401, "{path}");
    }
    // A browser opening a page gets a form asking for the token (sent back as ?token=
    // to the same page), not JSON; the API and the assets keep answering JSON.
    let q_dead = format!("/queues/{q}/dead");
    for (path, form) in [
        ("/", true),
        (q_dead.as_str(), true),
        ("/api/queues", false),
        ("/assets/app.js", false),
    ] {
        let answer = send(
            &app,
            Request::get(path)
                .header("accept", "text/html,application/xhtml+xml")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, 401, "{path}");
        let html = answer.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html");
        assert_eq!(html, form, "{path}: {}", answer.body);
        if form {
            assert!(
                answer.body.contains(&format!(r#"action="{path}""#)),
                "{}",
                answer.body
            );
            assert!(
                answer.body.contains(r#"type="password" name="token""#),
                "{}",
                answer.body
            );
        }
    }
    // The page's query rides along the sign-in, its values escaped.
    let listed = page(&app, "/?queues=a,b&limit=5&x=%22%3E%3Cb%3E").await;
    for field in [
        r#"<input type="hidden" name="queues" value="a,b">"#,
        r#"<input type="hidden" name="limit" value="5">"#,
        r#"<input type="hidden" name="x" value="&quot;&gt;&lt;b&gt;">"#,
    ] {
        assert!(listed.body.contains(field), "{field} in {}", listed.body);
    }
    // The form's address is escaped.
    let hostile = page(&app, "/queues/%22%3E%3Cscript%3E/dead").await;
    assert!(!hostile.body.contains("<script>"), "{}", hostile.body);

    let bearer = format!("Bearer {token}");
    let ok = send(
        &app,
        Request::get("/api/queues")
            .header("authorization", &bearer)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(ok.status, 200);
    let pause = format!("/api/queues/{q}/pause");
    assert_eq!(send(&app, raw_post(&pause, &[])).await.status, 401);

    // A login never redirects to another site.
    let login = get(&app, &format!("//evil.example/x?token={token}")).await;
    assert_eq!(login.status, 303);
    assert_eq!(login.headers["location"], "/evil.example/x");
    // A wrong ?token= is refused; the right one sets an HttpOnly cookie and drops the
    // token from the address.
    assert_eq!(get(&app, "/?token=wrong").await.status, 401);
    let login = get(&app, &format!("/queues/{q}/dead?limit=5&token={token}")).await;
    assert_eq!(login.status, 303);
    assert_eq!(
        login.headers["location"],
        format!("/queues/{q}/dead?limit=5")
    );
    let cookie = login.headers["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token),
        "the cookie holds a session, not the token"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = send(
        &app,
        Request::get(format!("/queues/{q}/dead"))
            .header("cookie", &session)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(page.status, 200);

    // With the cookie, actions still need the CSRF token: the cookie is ambient.
    let csrf = csrf_of(&page.body);
    let no_csrf = send(&app, raw_post(&pause, &[("cookie", &session)])).await;
    assert_eq!(no_csrf.status, 403);
    let with_csrf = send(
        &app,
        raw_post(&pause, &[("cookie", &session), ("x-relayq-csrf", &csrf)]),
    )
    .await;
    assert_eq!(with_csrf.status, 200, "{}", with_csrf.body);
    assert!(db.backend.queue_stats(&q).await.unwrap().paused);

    // A Bearer request needs no CSRF token (no browser adds that header by itself), but
    // a cross-site one is still refused.
    let resume = format!("/api/queues/{q}/resume");
    let cross = send(
        &app,
        raw_post(
            &resume,
            &[("authorization", &bearer), ("sec-fetch-site", "cross-site")],
        ),
    )
    .await;
    assert_eq!(cross.status, 403);
    let script = send(&app, raw_post(&resume, &[("authorization", &bearer)])).await;
    assert_eq!(script.status, 200);
    assert!(!db.backend.queue_stats(&q).await.unwrap().paused);
}

#[tokio::test]
async fn options_are_checked_by_field() {
    let bad_queue = Options {
        queues: vec!["a b".into()],
        ..Options::default()
    };
    assert_eq!(
        bad_queue.validate().unwrap_err().invalid_field(),
        Some("queue")
    );
    let empty_token = Options {
        token: Some(String::new()),
        ..Options::default()
    };
    assert_eq!(
        empty_token.validate().unwrap_err().invalid_field(),
        Some("token")
    );
    let debug = format!(
        "{:?}",
        Options {
            token: Some("s3cret".into()),
            ..Options::default()
        }
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[tokio::test]
async fn without_a_token_only_loopback_and_allowed_hosts_are_answered() {
    let db = sqlite().await;
    let q = queue();
    let get_as = |app: &axum::Router, host: &str| {
        let request = Request::get("/")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move { send(&app, request).await }
    };
    // A rebound name: the browser thinks it is same-origin, the Host header says not.
    let app = router(db.backend.clone(), Options::default());
    let rebound = get_as(&app, "evil.example:8080").await;
    assert_eq!(rebound.status, 403);
    assert!(
        !rebound.body.contains("relayq-csrf"),
        "no page, so no CSRF token"
    );
    let post = send(
        &app,
        raw_post(
            &format!("/api/queues/{q}/pause"),
            &[
                ("host", "evil.example:8080"),
                ("origin", "http://evil.example:8080"),
            ],
        ),
    )
    .await;
    assert_eq!(post.status, 403);
    assert!(!db.backend.queue_stats(&q).await.unwrap().paused);
    for host in ["127.0.0.1:8080", "localhost:8080", "[::1]:8080"] {
        assert_eq!(get_as(&app, host).await.status, 200, "{host}");
    }
    // A name the embedding service lists.
    let listed = router(
        db.backend.clone(),
        Options {
            allowed_hosts: vec!["dash.internal".into()],
            ..Options::default()
        },
    );
    assert_eq!(get_as(&listed, "dash.internal:8080").await.status, 200);
    assert_eq!(get_as(&listed, "evil.example").await.status, 403);
    // With a token, the token decides.
    let guarded = router(
        db.backend.clone(),
        Options {
            token: Some("t0k".into()),
            ..Options::default()
        },
    );
    assert_eq!(get_as(&guarded, "dash.example.com").await.status, 401);
}
