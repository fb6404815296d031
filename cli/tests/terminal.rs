//! `relayq run` on a real terminal: a pseudo-terminal of 160×50, its output read by a
//! terminal emulator (vt100), and the final screen checked. The live display (one bar
//! per stage, a spinner per running command) must leave one bar per stage behind and
//! no stale copies of bars, however often commands start and end.

mod common;

use std::{
    fs::File,
    io::Read,
    os::fd::OwnedFd,
    process::Stdio,
    sync::mpsc,
    time::{Duration, Instant},
};

use common::Env;
use nix::pty::{Winsize, openpty};

const ROWS: u16 = 50;
const COLS: u16 = 160;

/// Runs `args` on a pseudo-terminal until it exits; returns the exit code and the
/// screen at the end (the visible rows and the scrollback, oldest first).
fn on_terminal(env: &Env, args: &[&str], limit: Duration) -> (i32, Vec<String>) {
    on_terminal_of(env, args, limit, COLS)
}

/// [`on_terminal`] on a terminal `cols` columns wide.
fn on_terminal_of(env: &Env, args: &[&str], limit: Duration, cols: u16) -> (i32, Vec<String>) {
    let size = Winsize {
        ws_row: ROWS,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).expect("openpty");
    let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup the pty"));
    let mut child = env
        .cmd(args)
        .env("TERM", "xterm-256color")
        .env_remove("NO_COLOR")
        .stdout(slave(&pty.slave))
        .stderr(slave(&pty.slave))
        .spawn()
        .expect("spawn relayq");
    // Only the child holds the terminal now: its exit ends the reads below.
    drop(pty.slave);
    let (tx, rx) = mpsc::channel();
    let mut master = File::from(pty.master);
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        // EIO once every writer is gone: the end of the output.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut screen = vt100::Parser::new(ROWS, cols, 10_000);
    let deadline = Instant::now() + limit;
    let code = loop {
        while let Ok(bytes) = rx.try_recv() {
            screen.process(&bytes);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < deadline,
            "relayq did not end within {limit:?}"
        );
        if let Ok(bytes) = rx.recv_timeout(Duration::from_millis(50)) {
            screen.process(&bytes);
        }
    };
    // What the child wrote before it exited.
    while let Ok(bytes) = rx.recv_timeout(Duration::from_millis(200)) {
        screen.process(&bytes);
    }
    (code, lines(&mut screen, cols))
}

/// Every row of the terminal, scrollback first.
fn lines(parser: &mut vt100::Parser, cols: u16) -> Vec<String> {
    parser.screen_mut().set_scrollback(usize::MAX);
    let back = parser.screen().scrollback();
    let mut out = Vec::new();
    // Page up through the scrollback, one screen at a time, from the top.
    let mut offset = back;
    loop {
        parser.screen_mut().set_scrollback(offset);
        let rows: Vec<String> = parser.screen().rows(0, cols).collect();
        let take = if offset >= usize::from(ROWS) {
            usize::from(ROWS)
        } else {
            offset
        };
        out.extend(rows.into_iter().take(take));
        if offset == 0 {
            break;
        }
        offset = offset.saturating_sub(usize::from(ROWS));
    }
    parser.screen_mut().set_scrollback(0);
    out.extend(parser.screen().rows(0, cols));
    out
}

/// `relayq dead list` on a 60-column terminal: the table fits, every row a whole row
/// between its borders, its long error wrapped inside its cell.
#[test]
fn tables_fit_a_narrow_terminal() {
    let env = Env::new();
    let plan = env.path("narrow.toml");
    std::fs::write(
        &plan,
        "[[job]]\nname = \"a-job-with-a-rather-long-name\"\nmax_attempts = 1\n\
         command = \"echo 'error: the table orders is locked by another session, try again later' >&2; exit 3\"\n",
    )
    .unwrap();
    env.run(&["run", plan.to_str().unwrap(), "-q", "narrow"])
        .expect_code(1);
    let (code, screen) = on_terminal_of(
        &env,
        &["dead", "list", "-q", "narrow"],
        Duration::from_secs(30),
        60,
    );
    assert_eq!(code, 0, "{screen:#?}");
    let table: Vec<&str> = screen
        .iter()
        .map(|l| l.trim_end())
        .filter(|l| l.starts_with(['┌', '│', '╞', '├', '└', '┆']))
        .collect();
    assert!(table.len() >= 5, "no table on the screen: {screen:#?}");
    for row in &table {
        assert!(
            row.ends_with(['┐', '│', '╡', '┤', '┘', '┆']),
            "a row broken by the terminal's wrapping: {row:?} in {screen:#?}"
        );
    }
    let text = screen.join("\n");
    assert!(text.contains("status 3"), "the error is shown: {text}");
}

#[test]
fn the_final_screen_holds_one_bar_per_stage() {
    let env = Env::new();
    // Many short commands over three stages: bars and spinners are drawn, added and
    // removed many times while the run goes on.
    let mut plan = String::new();
    for stage in [1, 2, 3] {
        for i in 0..8 {
            plan.push_str(&format!(
                "[[job]]\nname = \"s{stage}-{i}\"\nstage = {stage}\ncommand = \"sleep 0.{}\"\n\n",
                1 + i % 3
            ));
        }
    }
    let path = env.path("plan.toml");
    std::fs::write(&path, plan).unwrap();
    let (code, screen) = on_terminal(
        &env,
        &["run", path.to_str().unwrap(), "--workers", "3"],
        Duration::from_secs(120),
    );
    let text = screen.join("\n");
    assert_eq!(code, 0, "the run failed:\n{text}");
    for stage in [1, 2, 3] {
        let bars: Vec<&String> = screen
            .iter()
            .filter(|l| l.contains(&format!("stage {stage} [")))
            .collect();
        assert_eq!(
            bars.len(),
            1,
            "stage {stage} should have one bar on the screen, found {}:\n{text}",
            bars.len()
        );
        assert!(
            bars[0].contains("8/8"),
            "stage {stage}'s bar is not full: {}",
            bars[0]
        );
    }
    // No spinner line of a command is left behind.
    let spinners: Vec<&String> = screen
        .iter()
        .filter(|l| l.contains("attempt 1/1)"))
        .collect();
    assert!(spinners.is_empty(), "stale spinner lines:\n{text}");
    assert!(text.contains("24 jobs"), "no totals line:\n{text}");
}
