//! Cost rows survive a `kill -9` while the cost database cannot be written (SPEC §16.4, issue
//! 33): the daemon keeps them in `agentd.db.spool`, fsynced before the answer is used, and the
//! next start writes them, once. The database refuses inserts into `costs` through a trigger
//! added from outside (`fail_cost_inserts`), so the disk itself stays writable.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::support::e2e::{
    WAIT, daemon_with, db_rows, fail_cost_inserts, fifo_write, wait_outcome,
};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::wait_until;

/// The price of `usage` under `e2e::provider_toml`'s rates (3 USD in, 15 USD out per million).
fn billed(usage: Usage) -> f64 {
    (usage.input as f64 * 3.0 + usage.output as f64 * 15.0) / 1e6
}

#[test]
fn cost_rows_spooled_while_the_database_fails_survive_kill_9() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let usages = [Usage::new(1000, 100, 0, 0), Usage::new(2000, 50, 0, 0)];
    // Two messages of two sessions whose model calls are in flight together when the
    // database starts to fail: both pass their budget check, both answers are paid for.
    let gate = Arc::new(Semaphore::new(0));
    for (text, usage) in ["one", "two"].into_iter().zip(usages) {
        llm.push(
            Reply::Text {
                text: text.into(),
                usage,
            }
            .gated(&gate),
        );
    }
    let mut d = daemon_with(&llm, "openai");
    fifo_write(
        &d,
        r#"{"id":"k1","type":"user","text":"first","sender":"ann"}"#,
    );
    fifo_write(
        &d,
        r#"{"id":"k2","type":"user","text":"second","sender":"ben"}"#,
    );
    wait_until(WAIT, "both model calls in flight", || {
        (llm.requests().len() == 2).then_some(())
    });
    fail_cost_inserts(&d.state_dir, true);
    gate.add_permits(2);
    for (key, id) in [("ann", "k1"), ("ben", "k2")] {
        let out = wait_outcome(&d, key, id);
        assert_eq!(out["type"], "message", "the answer paid for arrives: {out}");
    }
    // No call while the rows are unwritten; the user is told why.
    fifo_write(
        &d,
        r#"{"id":"k3","type":"user","text":"third","sender":"ann"}"#,
    );
    let third = wait_outcome(&d, "ann", "k3");
    let reply = third["reply"].as_str().unwrap_or_default();
    assert!(
        third["type"] == "failure" && reply.contains("could not be written"),
        "{third}"
    );
    assert_eq!(llm.requests().len(), 2);
    assert!(
        db_rows(&d.state_dir).is_empty(),
        "no row reached the database"
    );

    // A crash, the database recovers, a start: every row billed is in the ledger.
    d.kill9();
    fail_cost_inserts(&d.state_dir, false);
    d.start();
    wait_until(WAIT, "the spooled cost rows in agentd.db", || {
        (db_rows(&d.state_dir).len() >= 2).then_some(())
    });
    // Once: a further restart writes nothing again.
    assert!(d.sigterm().success());
    d.start();
    assert!(d.sigterm().success());
    let rows = db_rows(&d.state_dir);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.0 == "fake-model" && r.1 == "chat" && r.7 == "fake"),
        "{rows:?}"
    );
    let input: i64 = rows.iter().map(|r| r.2).sum();
    let output: i64 = rows.iter().map(|r| r.3).sum();
    assert_eq!((input, output), (3000, 150));
    let total: f64 = rows.iter().map(|r| r.6).sum();
    let expected: f64 = usages.into_iter().map(billed).sum();
    assert!((total - expected).abs() < 1e-12, "{total} != {expected}");
    assert_eq!(
        std::fs::metadata(d.state_dir.join("agentd.db.spool"))
            .map(|m| m.len())
            .unwrap_or(0),
        0,
        "the spool is empty"
    );
}
