//! The three guards: the token (every route), CSRF and same-origin (every action), and
//! HTML escaping for the little the server writes into pages itself.

use axum::{
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Redirect, Response},
};

use crate::{error::ApiError, state::AppState};

/// The header every action must carry, holding the token the page embeds.
pub(crate) const CSRF_HEADER: &str = "x-relayq-csrf";
/// The session cookie a `?token=` login sets.
const SESSION_COOKIE: &str = "relayq_session";

/// With [`Options::token`](crate::Options::token) set, lets a request through only
/// with the token as a Bearer header or the session cookie; a GET with `?token=` that
/// matches sets the cookie and redirects to the same URL without it, so the token does
/// not stay in the address bar or the history.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = state.options.token.as_deref() else {
        return next.run(request).await;
    };
    let headers = request.headers();
    if bearer(headers).is_some_and(|b| eq(b, token))
        || cookie(headers, SESSION_COOKIE).is_some_and(|c| eq(c, &state.session))
    {
        return next.run(request).await;
    }
    if request.method() == Method::GET
        && let Some((given, rest)) = take_token_param(request.uri().query())
    {
        if eq(&given, token) {
            return login(&state, &request, rest.as_deref());
        }
        // No detail: the answer must not help guess the token.
        return unauthorized(&request);
    }
    unauthorized(&request)
}

/// Sets the session cookie and sends the browser back to the URL it asked for, less
/// the token.
fn login(state: &AppState, request: &Request, rest: Option<&str>) -> Response {
    // The path as the browser sees it, even when this router is nested in another.
    let path = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| request.uri().path().to_owned(), |o| o.path().to_owned());
    // One leading slash: `//host` would send the browser to another site.
    let path = format!("/{}", path.trim_start_matches('/'));
    let target = match rest {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path,
    };
    let base = crate::pages::base_path(request);
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Path={}",
        state.session,
        if base.is_empty() { "/" } else { &base }
    );
    let mut response = Redirect::to(&target).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn unauthorized(request: &Request) -> Response {
    let mut response = if wants_page(request) {
        login_form(request)
    } else {
        ApiError::status(
            StatusCode::UNAUTHORIZED,
            "this dashboard needs its token: send `Authorization: Bearer <token>`, or open any page once with ?token=<token>",
        )
        .into_response()
    };
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"relayq\""),
    );
    response
}

/// Whether `request` is a browser opening a page (not the API, an asset or a script's
/// fetch): it gets the login form rather than JSON.
fn wants_page(request: &Request) -> bool {
    let path = request.uri().path();
    request.method() == Method::GET
        && !path.starts_with("/api/")
        && !path.starts_with("/assets/")
        && path != "/metrics"
        && request
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

/// A page with one field, the token, sent back to the same address as `?token=`, which
/// sets the session cookie and drops the token from the address (see [`login`]); the
/// address's other query fields ride along as hidden fields. Plain HTML: the stylesheet
/// is behind the token too, and the policy allows no inline style.
fn login_form(request: &Request) -> Response {
    let path = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| request.uri().path().to_owned(), |o| o.path().to_owned());
    let action = escape_html(&format!("/{}", path.trim_start_matches('/')));
    let kept: String = url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
        .filter(|(k, _)| k != "token")
        .map(|(k, v)| {
            format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                escape_html(&k),
                escape_html(&v)
            )
        })
        .collect();
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>relayq: sign in</title></head>\n<body><main>\
         <h1>relayq</h1><p>This dashboard needs its token.</p>\
         <form method=\"get\" action=\"{action}\">{kept}\
         <label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" \
         required autofocus></label> <button type=\"submit\">Sign in</button></form>\
         </main></body></html>\n"
    );
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page,
    )
        .into_response()
}

/// Without a token, answers only requests addressed to loopback or to
/// [`Options::allowed_hosts`](crate::Options::allowed_hosts). This stops DNS
/// rebinding: a site whose name now resolves to 127.0.0.1 is same-origin with the
/// dashboard in the browser's eyes, so it could read a page (and its CSRF token) and
/// post actions; its requests still carry its own name in `Host`. A request without
/// `Host` (HTTP/1.0) comes from no browser and passes.
pub(crate) async fn require_known_host(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if state.options.token.is_some() {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_owned())
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    match host {
        Some(host) if !host_allowed(&host, &state.options.allowed_hosts) => forbidden(
            "this dashboard has no token, so it answers only on loopback names (localhost, 127.0.0.1, [::1]) and Options::allowed_hosts",
        ),
        _ => next.run(request).await,
    }
}

/// Whether `host` (a `Host` header: name or address, maybe with a port) is loopback or
/// listed in `allowed`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback
        || allowed
            .iter()
            .any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name))
}

/// Guards every action: a POST from this dashboard's own pages only. A browser's
/// cross-site request is refused by `Sec-Fetch-Site` or `Origin`, and anything else
/// needs the CSRF token, which only a page of this dashboard holds. A request that
/// carries the configured Bearer token needs no CSRF token: no browser attaches that
/// header by itself, so it cannot be forged from another site.
pub(crate) async fn require_same_origin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return forbidden("actions are POST only");
    }
    let headers = request.headers();
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return forbidden("cross-site request refused (Sec-Fetch-Site)");
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && !origin_matches_host(origin, headers.get(header::HOST))
    {
        return forbidden("cross-origin request refused (Origin does not match Host)");
    }
    let bearer_ok = state
        .options
        .token
        .as_deref()
        .is_some_and(|t| bearer(headers).is_some_and(|b| eq(b, t)));
    let csrf_ok = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| eq(v, &state.csrf));
    if !bearer_ok && !csrf_ok {
        return forbidden("missing or wrong CSRF token (header x-relayq-csrf)");
    }
    next.run(request).await
}

fn forbidden(why: &str) -> Response {
    ApiError::status(StatusCode::FORBIDDEN, why).into_response()
}

/// Whether `Origin` (`scheme://host[:port]`) names the host the request was sent to.
fn origin_matches_host(origin: &HeaderValue, host: Option<&HeaderValue>) -> bool {
    let (Ok(origin), Some(Ok(host))) = (origin.to_str(), host.map(HeaderValue::to_str)) else {
        return false;
    };
    origin
        .split_once("://")
        .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// Splits `token=...` out of a query: the token (percent-decoded) and the rest.
fn take_token_param(query: Option<&str>) -> Option<(String, Option<String>)> {
    let query = query?;
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("token=") {
            Some(value) if token.is_none() => token = Some(percent_decode(value)),
            _ => rest.push(pair),
        }
    }
    token.map(|t| (t, (!rest.is_empty()).then(|| rest.join("&"))))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Compares secrets in time that does not depend on where they first differ.
fn eq(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Escapes text for an HTML element body or a double-quoted attribute.
pub(crate) fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_html_leaves_no_markup() {
        assert_eq!(
            escape_html("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn secrets_compare_by_value_and_length() {
        assert!(eq("abc", "abc"));
        assert!(!eq("abd", "abc"));
        assert!(!eq("ab", "abc"));
        assert!(!eq("abcd", "abc"));
        assert!(!eq("", "abc"));
    }

    #[test]
    fn token_param_is_split_out_and_decoded() {
        assert_eq!(
            take_token_param(Some("a=1&token=x%2By+z&b=2")),
            Some(("x+y z".to_owned(), Some("a=1&b=2".to_owned())))
        );
        assert_eq!(
            take_token_param(Some("token=t")),
            Some(("t".to_owned(), None))
        );
        assert_eq!(take_token_param(Some("a=1")), None);
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn hosts_are_loopback_or_allowed() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:80",
            "127.9.9.9",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(host_allowed(host, &[]), "{host}");
        }
        for host in [
            "evil.example:8080",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "[::2]:80",
            "",
        ] {
            assert!(!host_allowed(host, &[]), "{host}");
        }
        let allowed = ["dash.internal".to_owned(), "ops:9000".to_owned()];
        assert!(host_allowed("dash.internal:8080", &allowed));
        assert!(host_allowed("ops:9000", &allowed));
        assert!(!host_allowed("ops:9001", &allowed));
    }

    #[test]
    fn origin_must_name_the_host() {
        let host = HeaderValue::from_static("127.0.0.1:8080");
        let same = HeaderValue::from_static("http://127.0.0.1:8080");
        let other = HeaderValue::from_static("http://evil.example");
        assert!(origin_matches_host(&same, Some(&host)));
        assert!(!origin_matches_host(&other, Some(&host)));
        assert!(!origin_matches_host(&same, None));
    }
}
