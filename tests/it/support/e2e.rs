//! Shared helpers for end-to-end tests of the real daemon: a minimal `agentd.toml` and provider
//! file pointed at a fake LLM, a started daemon, a single-write FIFO line, and the wait for the
//! trail line that completes one intake.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::fake_llm::FakeLlm;
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

/// How long an e2e test waits for one outcome.
pub const WAIT: Duration = Duration::from_secs(30);

/// A minimal `agentd.toml` that loads the one provider file `provider`.
pub fn agentd_toml(provider: &str) -> String {
    format!(
        r#"
[agent]
name = "testbot"
workspace = "../workspace"
timezone = "UTC"

[providers]
dir = "../providers.d"
load = ["{provider}"]

[behavior]
api_retry_base_delay_seconds = 0.01

[logging]
file = false
"#
    )
}

/// A provider file for a fake server. Sonnet-class prices so costs are non-trivial.
pub fn provider_toml(kind: &str, base_url: &str) -> String {
    format!(
        r#"
type = "{kind}"
base_url = "{base_url}"

[models.primary]
model = "fake-model"
max_tokens = 1024
cost_per_mtok = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}
"#
    )
}

/// Start a daemon whose `primary` model is served by `fake`.
pub fn daemon_with(fake: &FakeLlm, kind: &str) -> TestDaemon {
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml(kind, &fake.base_url()))],
    );
    d.start();
    d
}

/// Write one control line into the FIFO with a single write, as agent-send does.
pub fn fifo_write(d: &TestDaemon, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.state_dir.join("control.pipe"))
        .expect("open control.pipe");
    let mut bytes = line.as_bytes().to_vec();
    bytes.push(b'\n');
    f.write_all(&bytes).expect("write control line");
}

/// (model, call_type, input, output, cache_read, cache_write, cost_usd, provider)
pub type CostRowTuple = (String, String, i64, i64, i64, i64, f64, String);

/// The rows of the `costs` table of `state_dir/agentd.db`, oldest first.
pub fn db_rows(state_dir: &Path) -> Vec<CostRowTuple> {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let mut st = conn
        .prepare("SELECT model, call_type, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, provider FROM costs ORDER BY id")
        .unwrap();
    st.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Make every insert into `costs` of `state_dir/agentd.db` fail with SQLite's "database or disk
/// is full" (a trigger, added from outside the daemon, that works while it runs), or work again.
/// Everything else of the database, and the disk, stay writable.
pub fn fail_cost_inserts(state_dir: &Path, fail: bool) {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    conn.execute_batch(if fail {
        "CREATE TRIGGER disk_full BEFORE INSERT ON costs BEGIN \
         SELECT RAISE(FAIL, 'database or disk is full'); END;"
    } else {
        "DROP TRIGGER disk_full;"
    })
    .unwrap();
}

/// The trail line that completes intake `id` (final assistant message or failure).
pub fn wait_outcome(d: &TestDaemon, key: &str, id: &str) -> Value {
    wait_until(WAIT, &format!("outcome of {id}"), || {
        d.trail(key).into_iter().find(|l| is_outcome_of(l, id))
    })
}

/// Wait until the daemon offers its MCP servers' tools to the model (it never waits for them
/// itself, SPEC §16.2); returns the log line, which names how many (`tools=N`).
pub fn wait_mcp_tools(d: &TestDaemon) -> String {
    wait_until(WAIT, "the MCP servers' tools offered to the model", || {
        d.log()
            .lines()
            .find(|l| l.contains("MCP tools offered to the model"))
            .map(String::from)
    })
}

pub fn is_outcome_of(l: &Value, id: &str) -> bool {
    let answers = l["reply_to"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r == id));
    answers && (l["final"] == true || l["type"] == "failure")
}

/// A started daemon on the fake provider `llm` (OpenAI wire) with Telegram on the fake Bot API
/// `tg`, bot token `token`, `allow_from = [allow]`; `channel` adds lines to
/// `[channel.telegram]`, `sections` adds whole sections before `[behavior]`, and `behavior`
/// adds lines to `[behavior]`.
pub fn telegram_daemon(
    llm: &FakeLlm,
    tg: &FakeTelegram,
    token: &str,
    allow: i64,
    channel: &str,
    sections: &str,
    behavior: &str,
) -> TestDaemon {
    telegram_daemon_for(llm, tg, token, &[allow], channel, sections, behavior)
}

/// [`telegram_daemon`] with `allow_from = allow`.
pub fn telegram_daemon_for(
    llm: &FakeLlm,
    tg: &FakeTelegram,
    token: &str,
    allow: &[i64],
    channel: &str,
    sections: &str,
    behavior: &str,
) -> TestDaemon {
    let mut d = telegram_daemon_unstarted(llm, tg, token, allow, channel, sections, behavior);
    d.start();
    d
}

/// [`telegram_daemon_for`], not started yet (a test puts a state directory in place first).
pub fn telegram_daemon_unstarted(
    llm: &FakeLlm,
    tg: &FakeTelegram,
    token: &str,
    allow: &[i64],
    channel: &str,
    sections: &str,
    behavior: &str,
) -> TestDaemon {
    let allow: Vec<String> = allow.iter().map(i64::to_string).collect();
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{}]\n{channel}\n\n{sections}[behavior]\n{behavior}",
            tg.api_url(),
            allow.join(", ")
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    d.set_env("AGENTD_TELEGRAM_TOKEN", token);
    d
}
