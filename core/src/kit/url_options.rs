//! relayq's own options in a URL's query (`?schema=`, `?prefix=`, `?max_connections=`):
//! taken out by a backend's [`Driver::open`](crate::Driver) before the URL reaches the
//! database driver, which would not know them; every other option is left where it is,
//! as written.

use crate::{Error, Result};

/// The options [`take`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The SQL schema the backend's tables live in.
    pub schema: Option<String>,
    /// The key prefix of every Redis key.
    pub prefix: Option<String>,
    /// The most pooled connections.
    pub max_connections: Option<u32>,
}

/// Splits `url` into the URL without the options named in `known`, and those options.
///
/// # Errors
/// [`Error::InvalidInput`] naming the option for an empty value, a repeated option,
/// or a `max_connections` that is not a whole number from 1.
pub fn take(url: &str, known: &[&'static str]) -> Result<(String, Options)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Options::default()));
    };
    let mut options = Options::default();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(&key) = known.iter().find(|k| **k == key) else {
            rest.push(pair);
            continue;
        };
        let value = decode(key, value)?;
        let slot = match key {
            "schema" => &mut options.schema,
            "prefix" => &mut options.prefix,
            _ => {
                let n = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        Error::invalid(key, format!("{value:?} is not a whole number from 1"))
                    })?;
                if options.max_connections.replace(n).is_some() {
                    return Err(Error::invalid(key, "given twice"));
                }
                continue;
            }
        };
        if slot.replace(value).is_some() {
            return Err(Error::invalid(key, "given twice"));
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, options))
}

/// A percent-decoded, non-empty option value.
fn decode(key: &'static str, value: &str) -> Result<String> {
    let text = url::form_urlencoded::parse(format!("v={value}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if text.is_empty() {
        return Err(Error::invalid(key, "empty"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &["schema", "prefix", "max_connections"];

    #[test]
    fn relayq_options_come_out_and_the_drivers_stay_as_written() {
        let (url, o) = take(
            "postgres://u@h/db?sslmode=require&schema=jobs_a&max_connections=4",
            ALL,
        )
        .unwrap();
        assert_eq!(url, "postgres://u@h/db?sslmode=require");
        assert_eq!(o.schema.as_deref(), Some("jobs_a"));
        assert_eq!(o.max_connections, Some(4));
        let (url, o) = take("redis://h/0?prefix=app%3Aq&allow_eviction=true", ALL).unwrap();
        assert_eq!(url, "redis://h/0?allow_eviction=true");
        assert_eq!(o.prefix.as_deref(), Some("app:q"));
        let (url, o) = take("redis://h/0?prefix=p", ALL).unwrap();
        assert_eq!(
            (url.as_str(), o.prefix.as_deref()),
            ("redis://h/0", Some("p"))
        );
        assert_eq!(take("sqlite://a.db", ALL).unwrap().0, "sqlite://a.db");
        // Not known for this scheme: left to the driver.
        let (url, o) = take("redis://h/0?schema=x", &["prefix"]).unwrap();
        assert_eq!((url.as_str(), o.schema), ("redis://h/0?schema=x", None));
    }

    #[test]
    fn bad_options_name_themselves() {
        for (url, field) in [
            ("postgres://h/db?max_connections=0", "max_connections"),
            ("postgres://h/db?max_connections=many", "max_connections"),
            ("postgres://h/db?schema=", "schema"),
            ("postgres://h/db?schema=a&schema=b", "schema"),
            ("redis://h?prefix", "prefix"),
        ] {
            let e = take(url, ALL).unwrap_err();
            assert_eq!(e.invalid_field(), Some(field), "{url}: {e}");
        }
    }
}
