//! `relayq job ID --why`: what holds a job back, in words and in JSON (SPEC M6).

mod common;

use common::Env;

#[test]
fn why_names_the_stage_and_the_pause() {
    let env = Env::new();
    env.run(&["batch", "open", "-q", "w"]).expect_code(0);
    env.run(&[
        "enqueue", "-q", "w", "--batch", "1", "--stage", "1", "--", "true",
    ])
    .expect_code(0);
    let id = env
        .run(&[
            "enqueue", "-q", "w", "--batch", "1", "--stage", "2", "--", "true",
        ])
        .expect_code(0)
        .stdout
        .trim()
        .to_owned();
    env.run(&["pause", "-q", "w"]).expect_code(0);
    let out = env.run(&["job", &id, "-q", "w", "--why"]).expect_code(0);
    assert!(
        out.stdout
            .contains("why:      stage 2 of batch 1 waits for stage 1: 1 job unfinished below it")
            && out.stdout.contains("why:      its queue is paused"),
        "{}",
        out.stdout
    );
    let json: serde_json::Value = serde_json::from_str(
        &env.run(&["job", &id, "-q", "w", "--why", "--json"])
            .expect_code(0)
            .stdout,
    )
    .unwrap();
    assert_eq!(json["why"].as_array().map(Vec::len), Some(2), "{json}");
    let plain = env.run(&["job", &id, "-q", "w"]).expect_code(0);
    assert!(
        !plain.stdout.contains("why:"),
        "only when asked: {}",
        plain.stdout
    );
}
