//! The HTML pages and their assets, embedded in the binary.
//!
//! Every page is the same small shell: the server writes only the page's kind, the
//! queue and id from the URL (validated, then escaped), the base path and the CSRF
//! token; `app.js` fetches the data as JSON and sets it as text. So no stored string
//! ever passes through HTML on the server.

use axum::{
    extract::{OriginalUri, Path, Request, State},
    http::{HeaderValue, StatusCode, Uri, header},
    response::{Html, IntoResponse, Response},
};

use crate::{
    api::{id, queue},
    error::ApiResult,
    security::escape_html,
    state::AppState,
};

const PAGE: &str = include_str!("../assets/page.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// The path this router is mounted under ("" at the root, "/relayq" when nested there).
pub(crate) fn base_path(request: &Request) -> String {
    let original = request
        .extensions()
        .get::<OriginalUri>()
        .map(|o| o.path().to_owned());
    strip_mount(original.as_deref(), request.uri())
}

fn strip_mount(original: Option<&str>, uri: &Uri) -> String {
    let inner = uri.path();
    let Some(original) = original else {
        return String::new();
    };
    original
        .strip_suffix(inner)
        .or_else(|| original.strip_suffix(inner.trim_end_matches('/')))
        .unwrap_or("")
        .trim_end_matches('/')
        .to_owned()
}

/// What one page shows.
struct Shell<'a> {
    page: &'static str,
    title: String,
    queue: &'a str,
    id: &'a str,
}

fn render(state: &AppState, original: &OriginalUri, uri: &Uri, shell: &Shell<'_>) -> Response {
    let base = strip_mount(Some(original.path()), uri);
    let (read_only, csrf) = if state.options.read_only {
        // A read-only page holds no CSRF token: there is nothing to post it to.
        ("true", "")
    } else {
        ("false", state.csrf.as_str())
    };
    let html = PAGE
        .replace("{{base}}", &escape_html(&base))
        .replace("{{page}}", shell.page)
        .replace("{{queue}}", &escape_html(shell.queue))
        .replace("{{id}}", &escape_html(shell.id))
        .replace("{{read_only}}", read_only)
        .replace("{{csrf}}", csrf)
        .replace("{{title}}", &escape_html(&shell.title));
    Html(html).into_response()
}

/// `GET /`: the queues.
pub(crate) async fn queues(
    State(state): State<AppState>,
    original: OriginalUri,
    uri: Uri,
) -> Response {
    let shell = Shell {
        page: "queues",
        title: "Queues".into(),
        queue: "",
        id: "",
    };
    render(&state, &original, &uri, &shell)
}

/// `GET /workers`: who serves the queues.
pub(crate) async fn workers(
    State(state): State<AppState>,
    original: OriginalUri,
    uri: Uri,
) -> Response {
    let shell = Shell {
        page: "workers",
        title: "Workers".into(),
        queue: "",
        id: "",
    };
    render(&state, &original, &uri, &shell)
}

/// `GET /queues/{queue}/{batches|jobs|running|dead|schedules}`.
pub(crate) async fn queue_page(
    State(state): State<AppState>,
    original: OriginalUri,
    uri: Uri,
    Path((name, list)): Path<(String, String)>,
) -> ApiResult<Response> {
    let (page, what) = match list.as_str() {
        "batches" => ("batches", "batches"),
        "jobs" => ("jobs", "jobs"),
        "charts" => ("charts", "charts"),
        "running" => ("running", "running now"),
        "dead" => ("dead", "dead jobs"),
        "schedules" => ("schedules", "schedules"),
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    let shell = Shell {
        page,
        title: format!("{} · {what}", queue(&name)?),
        queue: &name,
        id: "",
    };
    Ok(render(&state, &original, &uri, &shell))
}

/// `GET /queues/{queue}`: its batches.
pub(crate) async fn queue_home(
    state: State<AppState>,
    original: OriginalUri,
    uri: Uri,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    queue_page(state, original, uri, Path((name, "batches".into()))).await
}

/// `GET /queues/{queue}/{batches|jobs}/{id}`: one batch, or one job with its attempts.
pub(crate) async fn item_page(
    State(state): State<AppState>,
    original: OriginalUri,
    uri: Uri,
    Path((name, kind, item)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let (page, field) = match kind.as_str() {
        "batches" => ("batch", "batch"),
        "jobs" => ("job", "job"),
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    id(field, &item)?;
    let shell = Shell {
        page,
        title: format!("{} · {field} {item}", queue(&name)?),
        queue: &name,
        id: &item,
    };
    Ok(render(&state, &original, &uri, &shell))
}

/// `GET /assets/app.js`.
pub(crate) async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

/// `GET /assets/style.css`.
pub(crate) async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_path_is_what_the_nesting_router_stripped() {
        let uri: Uri = "/queues/a/dead".parse().unwrap();
        assert_eq!(strip_mount(Some("/relayq/queues/a/dead"), &uri), "/relayq");
        assert_eq!(strip_mount(Some("/queues/a/dead"), &uri), "");
        let root: Uri = "/".parse().unwrap();
        assert_eq!(strip_mount(Some("/relayq/"), &root), "/relayq");
        assert_eq!(strip_mount(Some("/relayq"), &root), "/relayq");
        assert_eq!(strip_mount(None, &uri), "");
    }
}
