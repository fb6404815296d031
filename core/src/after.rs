//! Dependencies between jobs of one batch (SPEC D): whom a job runs after, what it does
//! when one of them fails, and the graph checks every backend shares.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::{Error, JobId, Result};

/// A job that a new job runs after (SPEC D1): one already stored in the same batch, or
/// one of the same [`enqueue`](crate::Enqueue::enqueue) call, by its place in the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum After {
    /// A job already stored in the same batch.
    Job(JobId),
    /// The job at this index of the same enqueue call (0 is the call's first job).
    Call(usize),
}

/// What a job does when a job it runs after ends dead or cancelled (SPEC D4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterFailure {
    /// It is cancelled, and so are the jobs that run after it.
    #[default]
    Cancel,
    /// It runs anyway, as if the failed job had succeeded.
    Run,
}

impl AfterFailure {
    /// The lower-case name used in storage and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Run => "run",
        }
    }
}

impl fmt::Display for AfterFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AfterFailure {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cancel" => Ok(Self::Cancel),
            "run" => Ok(Self::Run),
            _ => Err(Error::invalid(
                "after_failure",
                format!("expected \"cancel\" or \"run\", got {s:?}"),
            )),
        }
    }
}

/// One cycle of a graph of `n` nodes whose edges are `edges(i)` (the nodes `i` runs
/// after), as node indexes in order, each running after the next and the last after the
/// first; `None` when the graph has no cycle.
///
/// Kahn's topological sort removes every node outside a cycle; from any node left, the
/// walk along its remaining edges must come back to a node it passed, and the nodes from
/// there on are one cycle. Linear in nodes and edges, without recursion, so a chain of
/// 10,000 jobs costs what 10,000 independent ones do.
#[must_use]
pub fn find_cycle<'a>(n: usize, edges: impl Fn(usize) -> &'a [usize]) -> Option<Vec<usize>> {
    // How many nodes each node still waits for, and who waits for each node.
    let mut waits = vec![0_usize; n];
    let mut waiters: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, w) in waits.iter_mut().enumerate() {
        for &p in edges(i) {
            *w += 1;
            waiters[p].push(i);
        }
    }
    let mut free: Vec<usize> = (0..n).filter(|&i| waits[i] == 0).collect();
    while let Some(p) = free.pop() {
        for &i in &waiters[p] {
            waits[i] -= 1;
            if waits[i] == 0 {
                free.push(i);
            }
        }
    }
    let start = (0..n).find(|&i| waits[i] > 0)?;
    // Every node left waits for at least one other node left.
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    let mut at = start;
    while seen[at] == usize::MAX {
        seen[at] = path.len();
        path.push(at);
        at = *edges(at)
            .iter()
            .find(|&&p| waits[p] > 0)
            .expect("a node left in the sort waits for another node left");
    }
    Some(path.split_off(seen[at]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
        find_cycle(edges.len(), |i| &edges[i])
    }

    #[test]
    fn graphs_without_a_cycle_have_none() {
        assert_eq!(cycle(&[]), None);
        assert_eq!(cycle(&[vec![], vec![0], vec![0], vec![1, 2]]), None);
        let chain: Vec<Vec<usize>> = (0..10_000)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(cycle(&chain), None);
    }

    #[test]
    fn a_cycle_is_named_in_order() {
        // 0 after 1, 1 after 2, 2 after 0; 3 after 0 is outside the cycle.
        let found = cycle(&[vec![1], vec![2], vec![0], vec![0]]).unwrap();
        assert_eq!(found.len(), 3);
        for (k, &i) in found.iter().enumerate() {
            let next = found[(k + 1) % found.len()];
            assert!(
                [vec![1], vec![2], vec![0]][i].contains(&next),
                "{i} runs after {next}"
            );
        }
    }

    #[test]
    fn a_self_edge_is_a_cycle_of_one() {
        assert_eq!(cycle(&[vec![], vec![1]]), Some(vec![1]));
    }

    #[test]
    fn a_cycle_behind_a_tail_leaves_the_tail_out() {
        // 0 after 1, 1 after 2, 2 after 1: the cycle is 1, 2.
        let found = cycle(&[vec![1], vec![2], vec![1]]).unwrap();
        let mut sorted = found.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2], "{found:?}");
    }
}
