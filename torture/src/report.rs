//! The table a run prints.

use std::fmt::Write as _;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use crate::run::Outcome;

/// How many lines of each check's violations (and excused cases) are shown.
const SHOWN: usize = 8;

/// The run's tables: the checks, then the figures and the faults, then the first
/// violations of each failed check.
#[must_use]
pub fn render(o: &Outcome, command: &str) -> String {
    let mut out = String::new();
    let verdict = if o.report.violations() == 0 {
        "no violation".to_owned()
    } else {
        format!("{} VIOLATIONS", o.report.violations())
    };
    let _ = writeln!(out, "\n== {}: {verdict}\n   {command}", o.kind);
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header([
        "check",
        "checked",
        "violations",
        "excused",
        "result",
    ]);
    for c in &o.report.checks {
        let result = if !c.violations.is_empty() {
            "FAIL"
        } else if c.checked == 0 {
            "ok (nothing to check)"
        } else {
            "ok"
        };
        t.add_row([
            c.name.to_owned(),
            c.checked.to_string(),
            c.violations.len().to_string(),
            c.excused.len().to_string(),
            result.to_owned(),
        ]);
    }
    let _ = writeln!(out, "{t}");
    let mut f = Table::new();
    f.load_style(UTF8_FULL_CONDENSED)
        .set_header(["figure", "value"]);
    f.add_row([
        "workload time".to_owned(),
        format!("{:.1} s", o.elapsed.as_secs_f64()),
    ]);
    for (k, v) in &o.report.figures {
        f.add_row([k.clone(), v.clone()]);
    }
    for (k, v) in &o.faults {
        f.add_row([format!("fault: {k}"), v.to_string()]);
    }
    let _ = writeln!(out, "{f}");
    for c in &o.report.checks {
        for (what, lines) in [("VIOLATION", &c.violations), ("excused", &c.excused)] {
            for l in lines.iter().take(SHOWN) {
                let _ = writeln!(out, "{what} [{}] {l}", c.name);
            }
            if lines.len() > SHOWN {
                let _ = writeln!(out, "{what} [{}] ... {} more", c.name, lines.len() - SHOWN);
            }
        }
    }
    if let Some(dir) = &o.kept {
        let _ = writeln!(
            out,
            "kept: {} (ledger, worker logs, server files)",
            dir.display()
        );
    }
    out
}
