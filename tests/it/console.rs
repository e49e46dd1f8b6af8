//! The web console (SPEC §22) in a real browser: Debian's chromium, headless, driven by
//! Selenium through `console_browser.py` (one JSON command a line), against the real daemon.
//! Screenshots of every page at 1280 and 390 px go to `target/tmp/console-shots/`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

use crate::http_daemon::reqwest;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::{free_port, wait_until};

const TOKEN: &str = "console-token-1";

/// The browser: `console_browser.py` with chromium behind it.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Browser {
    fn start(base: &str) -> Browser {
        let peers = crate::support::test_peers(
            "browser",
            "apt-get (chromium, chromium-driver) and pip (selenium)",
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/console_browser.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .env("PYTHONPATH", peers.join("browser/py"))
            .env("AGENTD_BASE", base)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3 console_browser.py");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Browser { child, stdin, out }
    }

    /// One command; panics with the driver's error.
    fn cmd(&mut self, c: Value) -> Value {
        let v = self.try_cmd(&c);
        assert_eq!(v["ok"], true, "browser command {c} failed: {v}");
        v
    }

    fn try_cmd(&mut self, c: &Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?} (the driver died?)"))
    }

    fn open(&mut self, path: &str) -> Value {
        self.cmd(json!({"op": "open", "path": path}))
    }

    fn login(&mut self, token: &str) -> Value {
        self.cmd(json!({"op": "login", "token": token}))
    }

    fn js(&mut self, script: &str) -> Value {
        self.cmd(json!({"op": "js", "script": script}))["value"].clone()
    }

    fn click(&mut self, css: &str) -> Value {
        self.cmd(json!({"op": "click", "css": css}))
    }

    fn wait_text(&mut self, css: &str, contains: &str) -> String {
        let v =
            self.cmd(json!({"op": "wait_text", "css": css, "contains": contains, "timeout": 60}));
        assert_eq!(v["found"], true, "{contains:?} never showed in {css}: {v}");
        v["text"].as_str().unwrap().to_string()
    }

    /// The value the overview shows for `label` now.
    fn overview_value(&mut self, label: &str) -> String {
        self.js(&format!(
            "const dt = [...document.querySelectorAll('#live dt')].find(e => e.textContent === {label:?}); \
             return dt ? dt.nextElementSibling.textContent : null;"
        ))
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Screenshots of the page at `path` at 1280 and 390 px wide, as `<name>-<width>.png`.
    /// At 390 px nothing may stick out sideways.
    fn shots(&mut self, path: &str, name: &str) {
        self.open(path);
        for width in [1280, 390] {
            let file = shots_dir().join(format!("{name}-{width}.png"));
            let v = self.cmd(json!({"op": "screenshot", "width": width, "path": file}));
            assert_eq!(
                v["overflow_x"], false,
                "{name} at {width} px is wider than the screen"
            );
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, r#"{{"op":"quit"}}"#);
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

fn page_title(b: &mut Browser) -> String {
    b.js("return document.querySelector('h1').textContent")
        .as_str()
        .unwrap()
        .to_string()
}

fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-shots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A daemon with the HTTP API (and so the console) on `port`, and `extra` config.
fn daemon(fake: &FakeLlm, port: u16, extra: &str) -> TestDaemon {
    let toml = format!(
        "{}\n[http]\nenabled = true\nport = {port}\nstatus_rate_limit = 1000\nrate_limit = 1000\n\n{extra}",
        agentd_toml("fake")
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    d
}

fn metrics(base: &str) -> String {
    reqwest::blocking_client()
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .unwrap()
        .text()
        .unwrap()
}

/// `POST path` with the browser's session cookie, `origin` and `csrf` (none: left out).
fn post_as(base: &str, path: &str, cookie: &str, origin: &str, csrf: Option<&str>) -> u16 {
    let mut body = "key=nobody".to_string();
    if let Some(t) = csrf {
        body.push_str(&format!("&csrf={t}"));
    }
    let c = reqwest::blocking_client();
    c.post(format!("{base}{path}"))
        .header("cookie", &format!("agentd_console={cookie}"))
        .header("origin", origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .unwrap()
        .status()
}

#[test]
fn console_login_logout_restart_csrf_and_origin() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, port, "");
    let mut b = Browser::start(&base);

    // No session: the login form.
    let page = b.open("/console/");
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/login"),
        "{page}"
    );
    let client = reqwest::blocking_client();
    let head = client.get(format!("{base}/console/login")).send().unwrap();
    let h = head.headers();
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");

    // A wrong token: refused and counted.
    let page = b.login("not-the-token");
    assert!(
        page["text"].as_str().unwrap().contains("wrong token"),
        "{page}"
    );
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/login"),
        "{page}"
    );
    assert!(metrics(&base).contains(r#"agentd_errors_total{kind="http_auth"} 1"#));

    // The right one: the overview, a strict cookie.
    let page = b.login(TOKEN);
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/"),
        "{page}"
    );
    assert!(
        page["text"].as_str().unwrap().contains("Overview"),
        "{page}"
    );
    // An open overview costs nothing: a few seconds on its live stream make no provider call
    // and change no file under the state directory (no channel polls in this daemon).
    b.wait_text("#live", "Deliveries");
    let before = state_files(&d.state_dir);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(b.overview_value("Running"), "0");
    assert_eq!(
        state_files(&d.state_dir),
        before,
        "the open overview wrote to disk"
    );
    assert!(
        fake.requests().is_empty(),
        "the open overview called the model"
    );
    let cookies = b.cmd(json!({"op": "cookies"}))["cookies"].clone();
    let c = cookies
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "agentd_console")
        .unwrap()
        .clone();
    assert_eq!(c["httpOnly"], true, "{c}");
    assert_eq!(c["sameSite"], "Strict", "{c}");
    assert_eq!(c["path"], "/console", "{c}");
    let cookie = c["value"].as_str().unwrap().to_string();
    let csrf = b.js("return document.querySelector('meta[name=csrf]').content");
    let csrf = csrf.as_str().unwrap();

    // State changes: the CSRF token and the console's origin, or refused.
    assert_eq!(
        post_as(&base, "/console/sessions/reset", &cookie, &base, None),
        403
    );
    assert_eq!(
        post_as(
            &base,
            "/console/sessions/reset",
            &cookie,
            "http://evil.example",
            Some(csrf)
        ),
        403
    );
    assert_eq!(
        post_as(
            &base,
            "/console/sessions/reset",
            &cookie,
            &base,
            Some("wrong")
        ),
        403
    );
    // Accepted: the 303 to the sessions page (followed by the client).
    assert_eq!(
        post_as(&base, "/console/sessions/reset", &cookie, &base, Some(csrf)),
        200
    );
    let status = b.cmd(json!({"op": "js_async", "script":
        "const done = arguments[0]; fetch('/console/sessions/reset', {method: 'POST', \
         headers: {'content-type': 'application/x-www-form-urlencoded'}, body: 'key=x'}) \
         .then(r => done(r.status));"}))["value"]
        .clone();
    assert_eq!(status, 403, "a POST from the page without its token");

    // Logout ends the session.
    let page = b.click("form.logout button");
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/login"),
        "{page}"
    );
    let page = b.open("/console/sessions");
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/login"),
        "{page}"
    );
    assert_eq!(
        post_as(&base, "/console/sessions/reset", &cookie, &base, Some(csrf)),
        401
    );

    // So does a restart.
    b.login(TOKEN);
    assert!(
        b.open("/console/sessions")["url"]
            .as_str()
            .unwrap()
            .ends_with("/console/sessions")
    );
    assert!(d.sigterm().success());
    d.start();
    let page = b.open("/console/sessions");
    assert!(
        page["url"].as_str().unwrap().ends_with("/console/login"),
        "{page}"
    );
    assert!(d.sigterm().success());
}

#[test]
fn console_overview_changes_when_a_message_arrives_and_a_delivery_fails() {
    const TG_TOKEN: &str = "123456:console-tg-token";
    const ALICE: i64 = 1001;
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TG_TOKEN);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    llm.push(Reply::text("Hello Alice!").gated(&gate));
    tg.fail_next_send(1, 400);
    let sections = format!("[http]\nenabled = true\nport = {port}\nstatus_rate_limit = 1000\n\n");
    let mut d = telegram_daemon_with_http(&llm, &tg, TG_TOKEN, ALICE, &sections);
    let mut b = Browser::start(&base);
    b.login(TOKEN);
    b.wait_text("#live", "Deliveries");
    assert_eq!(b.overview_value("Failed"), "0");
    assert_eq!(b.overview_value("Running"), "0");
    // Marks this page: a reload would lose it.
    b.js("window.__sameLoad = 'yes'; return 1;");

    tg.push_text(ALICE, ALICE, "hi bot");
    wait_until(WAIT, "the running message on the overview", || {
        (b.overview_value("Running") == "1").then_some(())
    });
    gate.add_permits(1);
    wait_until(WAIT, "the failed delivery on the overview", || {
        (b.overview_value("Failed") == "1").then_some(())
    });
    assert_eq!(
        b.js("return window.__sameLoad;"),
        "yes",
        "the page was reloaded"
    );
    assert!(d.sigterm().success());
}

/// Every file under `dir` with its length and modification time.
fn state_files(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                todo.push(e.path());
            } else if let Ok(modified) = meta.modified() {
                out.push((e.path(), meta.len(), modified));
            }
        }
    }
    out.sort();
    out
}

/// `e2e::telegram_daemon` with the API token set before the start.
fn telegram_daemon_with_http(
    llm: &FakeLlm,
    tg: &FakeTelegram,
    token: &str,
    alice: i64,
    sections: &str,
) -> TestDaemon {
    let mut d = crate::support::e2e::telegram_daemon_unstarted(
        llm,
        tg,
        token,
        &[alice],
        "poll_timeout_seconds = 1\nformat = \"plain\"",
        sections,
        "debounce_ms = 50",
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    d
}

#[test]
fn console_approval_clicked_runs_the_command_once() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, port, "[approvals]\nrequire = [\"exec\"]\n");
    let marker = d.workspace().join("ran");
    fake.push(Reply::tool_calls(vec![(
        "c1",
        "exec",
        json!({ "command": format!("echo once >> {}", marker.display()) }),
    )]));
    fake.push(Reply::text("done"));
    fifo_write(
        &d,
        r#"{"id":"a1","type":"user","text":"run it","sender":"sam"}"#,
    );
    let mut b = Browser::start(&base);
    b.login(TOKEN);
    wait_until(WAIT, "the approval on the page", || {
        let page = b.open("/console/approvals");
        page["text"]
            .as_str()
            .unwrap()
            .contains("Approve")
            .then_some(())
    });
    let text = b.cmd(json!({"op": "text", "css": "article.approval"}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("exec") && text.contains("sam"), "{text}");
    b.shots("/console/approvals", "approvals");
    assert!(!marker.exists(), "ran before the yes");
    b.click("form.decide button[value=approve]");
    wait_outcome(&d, "sam", "a1");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "once\n");
    let page = b.open("/console/approvals");
    let text = page["text"].as_str().unwrap();
    assert!(text.contains("Nothing waits"), "{text}");
    assert!(text.contains("exec · approve"), "the history: {text}");
    assert!(d.sigterm().success());
}

/// A tool result holding markup: it shows as text and runs nothing.
const HOSTILE: &str =
    r#"<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=2;alert(2)</script>"#;

#[test]
fn console_session_page_shows_tool_calls_and_hostile_text_as_text() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // A weekly entry (never due in the test): the schedules page shows it.
    let schedule = "[[schedule]]\nname = \"weekly-report\"\ncron = \"0 9 * * 1\"\nsystem = \"Write the weekly report\"\nprecheck = \"test -s report-input.txt\"\n";
    let mut d = daemon(&fake, port, schedule);
    let file = d.workspace().join("page.html");
    std::fs::write(&file, HOSTILE).unwrap();
    fake.push(Reply::tool_calls(vec![(
        "c1",
        "exec",
        json!({ "command": format!("cat {}", file.display()) }),
    )]));
    fake.push(Reply::text("I read the page."));
    fifo_write(
        &d,
        r#"{"id":"h1","type":"user","text":"read the page","sender":"sam"}"#,
    );
    wait_outcome(&d, "sam", "h1");
    let id = d.session_id("sam").unwrap();

    let mut b = Browser::start(&base);
    b.login(TOKEN);
    let page = b.open("/console/sessions");
    assert!(page["text"].as_str().unwrap().contains("sam"), "{page}");
    b.click("table a");
    let text = b.wait_text("main", "Tool call: exec");
    assert!(
        text.contains("read the page") && text.contains("I read the page."),
        "{text}"
    );
    assert!(page_title(&mut b).starts_with("Session sam"));
    b.click("details.tool-result summary");
    let shown = b.wait_text("details.tool-result", "<script>");
    assert!(shown.contains("<img src=x onerror="), "{shown}");
    assert_eq!(
        b.js("return window.__pwned === undefined"),
        true,
        "the markup ran"
    );
    assert_eq!(
        b.js("return document.querySelectorAll('main img, main script').length"),
        0
    );
    assert_eq!(b.cmd(json!({"op": "alert"}))["alert"], Value::Null);
    // The search box keeps the turns that hold the words.
    b.cmd(json!({"op": "type", "css": "#find", "text": "I read the page"}));
    b.wait_text("#find-count", "1 matching");
    b.shots(&format!("/console/sessions/{id}"), "session");
    b.shots("/console/sessions", "sessions");
    b.shots("/console/", "overview");
    let page = b.open("/console/schedules");
    assert!(
        page["text"].as_str().unwrap().contains("weekly-report"),
        "{page}"
    );
    b.shots("/console/schedules", "schedules");
    b.shots("/console/memory", "memory");
    b.cmd(json!({"op": "open", "path": "/console/login"}));
    assert!(d.sigterm().success());
}

/// Rows of the cost ledger over three days, two models, two sources.
fn seed_ledger(state_dir: &Path) {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let now = chrono::Utc::now().timestamp();
    let rows = [
        (now - 2 * 86_400, "claude-x", "telegram", 1000, 3000, 0.125),
        (now - 86_400, "claude-x", "http", 500, 500, 0.25),
        (now - 86_400, "gpt-y", "system", 800, 0, 0.0625),
        (now, "gpt-y", "telegram", 100, 900, 0.5),
        (now - 40 * 86_400, "gpt-y", "telegram", 100, 900, 2.0),
    ];
    for (ts, model, source, input, read, cost) in rows {
        conn.execute(
            "INSERT INTO costs (timestamp, session_id, model, provider, call_type, input_tokens, \
             output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, source) \
             VALUES (?1, 'seeded', ?2, 'fake', 'chat', ?3, 10, ?4, 0, ?5, ?6)",
            rusqlite::params![ts, model, input, read, cost, source],
        )
        .unwrap();
    }
}

#[test]
fn console_cost_totals_equal_the_api_and_charts_are_drawn() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, port, "");
    seed_ledger(&d.state_dir);
    let mut b = Browser::start(&base);
    b.login(TOKEN);
    b.open("/console/costs");
    for period in ["today", "week", "month", "all"] {
        let api: Value = reqwest::blocking_client()
            .get(format!("{base}/api/v1/cost?period={period}"))
            .bearer_auth(TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let shown = b.js(&format!(
            "return document.querySelector('dd[data-period={period}]').dataset.total"
        ));
        let shown: f64 = shown.as_str().unwrap().parse().unwrap();
        assert_eq!(
            shown,
            api["total_cost"].as_f64().unwrap(),
            "{period}: {api}"
        );
    }
    assert!(
        b.js("return document.querySelectorAll('svg.chart rect').length")
            .as_u64()
            .unwrap()
            >= 4
    );
    assert!(
        b.js("return document.querySelectorAll('svg.chart circle').length")
            .as_u64()
            .unwrap()
            >= 2
    );
    assert_eq!(
        b.js("return document.querySelectorAll('ol.bars meter').length"),
        1,
        "the one seeded session's bar"
    );
    let legend = b.cmd(json!({"op": "text", "css": ".legend"}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        legend.contains("claude-x") && legend.contains("gpt-y"),
        "{legend}"
    );
    b.shots("/console/costs", "costs");
    b.open("/console/costs");
    b.click("a[href='/console/costs?by=source']");
    let legend = b.cmd(json!({"op": "text", "css": ".legend"}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        legend.contains("telegram") && legend.contains("system"),
        "{legend}"
    );
    b.shots("/console/costs?by=source", "costs-by-source");
    assert!(d.sigterm().success());
}

#[test]
fn console_chat_streams_the_answer() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, port, "");
    fake.push(Reply::text(
        "Streamed hello from the fake model, in several pieces.",
    ));
    let mut b = Browser::start(&base);
    b.login(TOKEN);
    b.open("/console/chat");
    b.cmd(json!({"op": "type", "css": "#chat-text", "text": "hello from the browser"}));
    b.click("#chat button");
    let text = b.wait_text("#chat-log .done", "Streamed hello from the fake model");
    assert!(text.contains("in several pieces."), "{text}");
    let deltas = b.js("return Number(document.querySelector('#chat-log .done').dataset.deltas)");
    assert!(
        deltas.as_u64().unwrap() >= 1,
        "no piece came before the end: {deltas}"
    );
    let trail = d.trail("web:console");
    assert!(
        trail
            .iter()
            .any(|l| l["type"] == "intake" && l["text"] == "hello from the browser"),
        "{trail:#?}"
    );
    b.shots("/console/chat", "chat");
    assert!(d.sigterm().success());
}
