//! Secrets hidden before a payload or a URL is shown to a person: one rule for the
//! dashboard, the CLI and logs.
//!
//! - In a JSON payload, the value of every field whose name looks secret
//!   ([`secret_name`]), at any depth, becomes [`MASK`]: `{"env":{"API_TOKEN":"***"}}`.
//! - In every string (and in a payload that is not JSON), the password of a URL
//!   (`scheme://user:PASSWORD@host`) becomes [`MASK`].
//!
//! ```
//! use relayq_core::redact;
//! let shown = redact::payload(br#"{"command":"deploy","env":{"API_TOKEN":"s3cret"}}"#);
//! assert_eq!(shown, r#"{"command":"deploy","env":{"API_TOKEN":"***"}}"#);
//! assert_eq!(redact::urls("postgres://app:pw@db/x"), "postgres://app:***@db/x");
//! ```

use serde_json::Value;

/// What a hidden value is shown as.
pub const MASK: &str = "***";

/// The words that make a field's name look secret, matched whole (case-insensitive)
/// against the name's parts: `API_TOKEN`, `dbPassword`, `x-auth`, `ssh_key`.
const SECRET_WORDS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "pass",
    "passphrase",
    "credential",
    "credentials",
    "auth",
    "authorization",
    "cookie",
    "session",
    "key",
    "apikey",
    "dsn",
    "signature",
    "private",
];

/// Whether a field named `name` looks like it holds a secret: one of its parts (split
/// at anything but a letter or digit, and where a lower-case letter meets an upper-case
/// one) is a secret word, or it contains `password`, `secret` or `token`.
#[must_use]
pub fn secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if ["password", "secret", "token"]
        .iter()
        .any(|w| lower.contains(w))
    {
        return true;
    }
    words(name).any(|w| SECRET_WORDS.contains(&w.to_ascii_lowercase().as_str()))
}

/// `name`'s parts: `dbPassword` → `db`, `Password`; `API_TOKEN` → `API`, `TOKEN`. Cuts
/// fall on character boundaries only (`größe` is one part).
fn words(name: &str) -> impl Iterator<Item = &str> {
    let mut cuts = vec![0];
    let mut previous: Option<char> = None;
    for (i, b) in name.char_indices() {
        if let Some(a) = previous {
            let boundary = !b.is_alphanumeric() || !a.is_alphanumeric();
            if boundary || (a.is_lowercase() && b.is_uppercase()) {
                cuts.push(i);
            }
        }
        previous = Some(b);
    }
    cuts.push(name.len());
    cuts.windows(2)
        .map(move |w| name[w[0]..w[1]].trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .into_iter()
}

/// `payload` as text for a person, with secrets masked (see the [module](self)).
/// Bytes that are not UTF-8 are shown with replacement characters.
#[must_use]
pub fn payload(payload: &[u8]) -> String {
    match serde_json::from_slice::<Value>(payload) {
        Ok(mut value) => {
            mask(&mut value);
            value.to_string()
        }
        Err(_) => urls(&String::from_utf8_lossy(payload)),
    }
}

/// Masks, in place, the secret-looking fields and the URLs' passwords of `value`.
pub fn mask(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (name, v) in fields.iter_mut() {
                if secret_name(name) && !v.is_null() {
                    *v = Value::String(MASK.to_owned());
                } else {
                    mask(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        Value::String(s) if s.contains("://") => *s = urls(s),
        _ => {}
    }
}

/// `text` with the password of every URL in it (`scheme://user:PASSWORD@host`)
/// replaced by [`MASK`].
#[must_use]
pub fn urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The authority ends at a path, query, fragment or white space; its user info at
        // the last '@' (a password may hold an unencoded '@').
        let end = after
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace() || c == '"')
            .unwrap_or(after.len());
        let (authority, tail) = after.split_at(end);
        match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(MASK);
                    out.push('@');
                    out.push_str(host);
                }
                None => out.push_str(authority),
            },
            None => out.push_str(authority),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_told_from_others() {
        for name in [
            "API_TOKEN",
            "token",
            "dbPassword",
            "AWS_SECRET_ACCESS_KEY",
            "ssh_key",
            "x-auth",
            "Authorization",
            "SESSION_ID",
            "DATABASE_DSN",
            "github_pat_token",
        ] {
            assert!(secret_name(name), "{name} not taken for a secret");
        }
        for name in [
            "command",
            "PATH",
            "HOME",
            "cwd",
            "timeout_ms",
            "name",
            "monkey",
            "größe",
            "名前",
            "aé",
        ] {
            assert!(!secret_name(name), "{name} taken for a secret");
        }
        assert!(secret_name("Schlüssel_token"));
        let unicode = "{\"größe\":1,\"名前\":\"x\"}";
        assert_eq!(payload(unicode.as_bytes()), unicode);
    }

    #[test]
    fn json_payloads_mask_secret_fields_at_any_depth() {
        let shown = payload(
            br#"{"command":"deploy","env":{"API_TOKEN":"s3cret","HOME":"/root"},
                 "hooks":[{"password":"x"}],"db":"postgres://app:pw@db:5432/x"}"#,
        );
        assert!(
            !shown.contains("s3cret") && !shown.contains(":pw@"),
            "{shown}"
        );
        assert!(shown.contains(r#""API_TOKEN":"***""#), "{shown}");
        assert!(shown.contains(r#""password":"***""#), "{shown}");
        assert!(shown.contains(r#""HOME":"/root""#), "{shown}");
        assert!(shown.contains("postgres://app:***@db:5432/x"), "{shown}");
    }

    #[test]
    fn other_payloads_mask_url_passwords() {
        assert_eq!(
            payload(b"run with redis://:pw@h:6379/0 and https://x.org/a"),
            "run with redis://:***@h:6379/0 and https://x.org/a"
        );
        assert_eq!(urls("a://u:p@ss@h/x"), "a://u:***@h/x");
        assert_eq!(urls("no url here"), "no url here");
        assert_eq!(payload(&[0xff, b'a']), "\u{fffd}a");
    }
}
