//! Reading columns, and writing the JSON documents that carry many values at once.

use std::{fmt::Write, time::Duration};

use chrono::{DateTime, NaiveDateTime, Utc};
use relayq_core::{Error, Result};
use tiberius::{FromSql, Row};

/// Column `i` of `row`, which may be NULL.
pub(crate) fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<Option<T>> {
    row.try_get::<T, usize>(i).map_err(crate::error::db)
}

/// Column `i` of `row`, which must not be NULL.
pub(crate) fn req<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    get(row, i)?.ok_or_else(|| Error::backend(format!("column {i} is unexpectedly NULL")))
}

/// An owned string column, which may be NULL.
pub(crate) fn text(row: &Row, i: usize) -> Result<Option<String>> {
    Ok(get::<&str>(row, i)?.map(str::to_owned))
}

/// A `datetime2` column holding UTC.
pub(crate) fn time(row: &Row, i: usize) -> Result<DateTime<Utc>> {
    Ok(req::<NaiveDateTime>(row, i)?.and_utc())
}

/// A `datetime2` column holding UTC, which may be NULL.
pub(crate) fn time_opt(row: &Row, i: usize) -> Result<Option<DateTime<Utc>>> {
    Ok(get::<NaiveDateTime>(row, i)?.map(|t| t.and_utc()))
}

/// A number column into the type the core uses.
pub(crate) fn num<T, V>(v: V) -> Result<T>
where
    T: TryFrom<V>,
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(v).map_err(Error::backend)
}

/// The result set `i` of a batch, which must exist.
pub(crate) fn set(sets: &[Vec<Row>], i: usize) -> Result<&[Row]> {
    sets.get(i)
        .map(Vec::as_slice)
        .ok_or_else(|| Error::backend(format!("the batch returned no result set {i}")))
}

/// `d` as (days, milliseconds) for `DATEADD(millisecond, ms, DATEADD(day, days, t))`:
/// `DATEADD` takes an `int`, which a century in milliseconds (or seconds) overflows.
pub(crate) fn split(d: Duration) -> (i32, i32) {
    const DAY_MS: u128 = 86_400_000;
    let ms = d.as_millis();
    let days = i32::try_from(ms / DAY_MS).unwrap_or(i32::MAX);
    // Below a day's worth, so it fits.
    let rest = i32::try_from(ms % DAY_MS).unwrap_or(0);
    (days, rest)
}

/// `d` in whole milliseconds as an `int` (leases are at most 7 days: 604,800,000 ms),
/// and at least 1.
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

/// `t` as `datetime2` text for `OPENJSON ... WITH (x datetime2(6))`.
pub(crate) fn iso(t: DateTime<Utc>) -> String {
    t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
}

/// `bytes` as hex, for `CONVERT(varbinary(max), x, 2)`: JSON carries no bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02X}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_split_into_days_and_milliseconds() {
        assert_eq!(split(Duration::from_millis(1500)), (0, 1500));
        assert_eq!(split(Duration::from_secs(86_400 + 2)), (1, 2000));
        let century = Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(split(century), (36_500, 0));
        assert_eq!(millis(Duration::from_secs(7 * 86_400)), 604_800_000);
        assert_eq!(millis(Duration::from_micros(10)), 1);
    }

    #[test]
    fn bytes_and_times_are_written_for_openjson() {
        assert_eq!(hex(&[0, 15, 255, 16]), "000FFF10");
        assert_eq!(hex(&[]), "");
        let t = DateTime::parse_from_rfc3339("2026-11-22T10:11:12.345678Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(iso(t), "2026-11-22T10:11:12.345678");
    }
}
