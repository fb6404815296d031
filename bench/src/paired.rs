//! The headline drain (concurrency 16, with the worker's prefetch) and the raw loops,
//! interleaved round by round: each round drains on every target, then runs the raw
//! loops on the same servers. Measured in a section of their own, the raw loops saw
//! another stretch of this machine, whose speed drifts by tens of percent within one
//! run (docs/BENCHMARKS.md), so the ratio to them moved with the drift as much as with
//! the code. Each round's ratio is printed too, and the median of those.

use crate::{Row, median, peers::Peers, raw, scenarios, targets::Target};

/// The servers whose raw loop the drain is compared with.
const SERVERS: &[&str] = &["postgres", "redis"];

pub async fn drain_and_raw(
    targets: &[Target],
    peers: &Peers,
    n: usize,
    prefetch: u32,
    runs: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut drains = Vec::new();
    let mut raws = Vec::new();
    for _ in 0..runs {
        drains.push(scenarios::drain(targets, peers, n, 16, Some(prefetch), 1).await?);
        raws.push(raw::loops(targets, n, 1).await?);
    }
    for server in SERVERS {
        let ratios: Vec<f64> = drains
            .iter()
            .zip(&raws)
            .filter_map(|(d, r)| Some(value(d, server)? / value(r, server)?))
            .collect();
        if !ratios.is_empty() {
            let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            crate::say(&format!(
                "{server}: drain / raw loop, round by round: {}; median {:.2}",
                each.join(", "),
                median(ratios)
            ));
        }
    }
    Ok(medians(drains).into_iter().chain(medians(raws)).collect())
}

fn value(rows: &[Row], target: &str) -> Option<f64> {
    rows.iter().find(|r| r.target == target).map(|r| r.value)
}

/// One row per row of the first round, holding the median over every round.
fn medians(rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r| Row {
            scenario: r.scenario.clone(),
            target: r.target.clone(),
            value: median(
                rounds
                    .iter()
                    .filter_map(|round| {
                        round
                            .iter()
                            .find(|x| x.scenario == r.scenario && x.target == r.target)
                            .map(|x| x.value)
                    })
                    .collect(),
            ),
            unit: r.unit,
            note: r.note.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, value: f64) -> Row {
        Row {
            scenario: "drain".to_owned(),
            target: target.to_owned(),
            value,
            unit: "jobs/s",
            note: String::new(),
        }
    }

    /// Each row is the median of its own target's rounds, not of the round's rows,
    /// and a round that lacks a target does not shift the others.
    #[test]
    fn medians_are_per_target_across_rounds() {
        let rounds = vec![
            vec![row("postgres", 10.0), row("redis", 100.0)],
            vec![row("postgres", 30.0)],
            vec![row("postgres", 20.0), row("redis", 300.0)],
        ];
        let got: Vec<(String, f64)> = medians(rounds)
            .into_iter()
            .map(|r| (r.target, r.value))
            .collect();
        assert_eq!(
            got,
            vec![("postgres".to_owned(), 20.0), ("redis".to_owned(), 300.0)]
        );
        assert!(medians(Vec::new()).is_empty());
    }
}
