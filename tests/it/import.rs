//! `agentd import openclaw` on a real OpenClaw state directory (tests/fixtures/openclaw, taken
//! from OpenClaw's repository): the dry run writes nothing; `--apply` brings the sessions
//! (archived, with their history), the memory notes (indexed: memory search in the daemon
//! finds them) and the skills (loaded by agentd's scanner); cron jobs and the Telegram
//! allow-list are printed, not written. A hostile directory is refused piece by piece.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::memory::{agentd, ask, is_consolidation, last_tool_result};
use crate::support::daemon::{TestDaemon, copy_dir_recursive};
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

const SESSION_ID: &str = "8555a0a4-0b79-459d-939c-e17cdbbf4fe2";

/// A copy of the fixture's state directory (the tests add to it).
fn openclaw_state() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openclaw/state");
    copy_dir_recursive(&fixture, dir.path());
    dir
}

/// Every file below `dir` with its content, sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

fn import(d: &TestDaemon, path: &Path, apply: bool) -> (String, String) {
    let path = path.display().to_string();
    let mut args = vec!["import", "openclaw", path.as_str()];
    if apply {
        args.push("--apply");
    }
    let out = agentd(d, &args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn importing_openclaw_brings_sessions_memory_and_skills_and_recall_finds_them() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    let src = openclaw_state();

    // Dry run: the report, and not one file written anywhere.
    let before = snapshot(d.dir.path());
    let (report, _) = import(&d, src.path(), false);
    assert_eq!(
        snapshot(d.dir.path()),
        before,
        "the dry run wrote:\n{report}"
    );
    for expected in [
        "dry run: nothing written",
        &format!("would import  agent:main:main ({SESSION_ID}) 6 message(s) (openclaw:gpt-5.4)"),
        "would import  workspace/memory/decisions.md",
        "would import  workspace/skills/weather/SKILL.md weather ->",
        "dropped: homepage, metadata",
        "skipped       cron job \"Reminder\": a one-shot (`at`) job",
        "\"@someone\" is not a numeric user id",
        "allow_from = [123456789, 987654321]",
        "name = \"openclaw-morning-brief\"\ncron = \"0 7 * * *\"",
        "every = \"30m\"\nsystem = \"Check the inbox and tell me what is urgent.\"",
    ] {
        assert!(report.contains(expected), "{expected:?} missing:\n{report}");
    }

    // What is printed loads as agentd config.
    let printed = report
        .split("(not written):\n")
        .nth(1)
        .expect("config printed");
    let with = d.config_path.with_file_name("with-openclaw.toml");
    let config = std::fs::read_to_string(&d.config_path).unwrap();
    std::fs::write(&with, format!("{config}\n{printed}")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["check-config", "-c"])
        .arg(&with)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .unwrap();
    let effective = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        effective.contains("allow_from = [123456789, 987654321]"),
        "{effective}"
    );
    assert!(effective.contains("openclaw-check-inbox"), "{effective}");
    std::fs::remove_file(&with).unwrap();

    // Apply: sessions archived, notes and skills in the workspace, notes indexed.
    let (report, _) = import(&d, src.path(), true);
    assert!(report.contains("imported      agent:main:main"), "{report}");
    assert!(
        report.contains("indexed"),
        "the notes are indexed: {report}"
    );
    let ws = d.workspace();
    let decisions = std::fs::read_to_string(ws.join("memory/decisions.md")).unwrap();
    assert!(decisions.contains("GIT_REQUEST"));
    // The workspace template has its own MEMORY.md: OpenClaw's goes beside the notes.
    let memory = std::fs::read_to_string(ws.join("memory/openclaw-MEMORY.md")).unwrap();
    assert!(memory.contains("Prefer small, reversible changes."));
    let skill = std::fs::read_to_string(ws.join("skills/weather/SKILL.md")).unwrap();
    assert!(skill.starts_with("---\nname: \"weather\"\n"), "{skill}");
    let config = std::fs::read_to_string(&d.config_path).unwrap();
    assert!(!config.contains("schedule") && !config.contains("allow_from"));

    // A second import finds everything already there.
    let (again, _) = import(&d, src.path(), true);
    assert!(again.contains("already imported"), "{again}");
    assert!(!again.contains("imported      "), "{again}");

    // `agentd consolidate` reads the imported session like any archived one: its facts reach
    // long-term memory.
    llm.set_responder(|body| {
        is_consolidation(body).then(|| {
            Reply::text(r#"{"facts": [{"entity": "the assistant", "attribute": "name", "value": "Hakua"}]}"#)
        })
    });
    let out = agentd(&d, &["consolidate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Vec<String> = (llm.requests().iter())
        .filter(|b| is_consolidation(b))
        .map(|b| b.to_string())
        .collect();
    assert!(sent.iter().any(|b| b.contains("はくあ")), "{sent:?}");

    d.start();
    // The session's history, archived.
    let out = d.agent_send(&["--history", SESSION_ID, "--full"]);
    let history = String::from_utf8_lossy(&out.stdout);
    assert!(history.contains("(archived)"), "{history}");
    assert!(history.contains("openclaw:agent:main:main"), "{history}");
    assert!(history.contains("はくあ、いい名前だね"), "{history}");
    // The skill is loaded, and memory search finds the imported notes.
    let search = |query: &str| Reply::ToolCalls {
        text: None,
        calls: vec![(
            "c".into(),
            "memory_search".into(),
            json!({ "query": query }),
        )],
        usage: Default::default(),
    };
    llm.push(search("reversible changes"));
    llm.push(search("Hakua"));
    llm.push(Reply::text("found it"));
    let before = llm.requests().len();
    let reqs = ask(&d, &llm, "what did my old agent note?", before + 3);
    let found = last_tool_result(&reqs[before + 1]);
    assert!(found.contains("memory/openclaw-MEMORY.md"), "{found}");
    assert!(found.contains("reversible"), "{found}");
    let found = last_tool_result(&reqs[before + 2]);
    assert!(found.contains("name: Hakua"), "{found}");
    assert!(
        reqs[before]["system"].to_string().contains("weather"),
        "the imported skill is in the skills index"
    );
    assert!(d.sigterm().success());
}

#[test]
fn a_hostile_openclaw_directory_is_refused_piece_by_piece() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.md");
    std::fs::write(&secret, "TOP-SECRET outside the directory").unwrap();
    std::fs::create_dir_all(outside.path().join("evil-skill")).unwrap();
    std::fs::write(
        outside.path().join("evil-skill/SKILL.md"),
        "---\nname: evil\ndescription: TOP-SECRET\n---\nbody\n",
    )
    .unwrap();

    let src = openclaw_state();
    let s = src.path();
    symlink(&secret, s.join("workspace/memory/leak.md")).unwrap();
    std::fs::remove_file(s.join("workspace/MEMORY.md")).unwrap();
    symlink(&secret, s.join("workspace/MEMORY.md")).unwrap();
    symlink(
        outside.path().join("evil-skill"),
        s.join("workspace/skills/evil"),
    )
    .unwrap();
    let sessions = s.join("agents/main/sessions");
    let index = std::fs::read_to_string(sessions.join("sessions.json")).unwrap();
    let index = index.replace(
        "\"agent:main:main\"",
        "\"agent:main:evil\": {\"sessionId\": \"../../../../etc/passwd\"},\n  \"agent:main:main\"",
    );
    std::fs::write(sessions.join("sessions.json"), index).unwrap();
    symlink(
        &secret,
        sessions.join("0b0b0b0b-0000-4000-8000-000000000000.jsonl"),
    )
    .unwrap();
    // An oversized note (over the indexer's 10 MiB).
    let big = std::fs::File::create(s.join("workspace/memory/huge.md")).unwrap();
    big.set_len(11 * 1024 * 1024).unwrap();
    // The whole directory given as a symlink is refused outright.
    let link = outside.path().join("link-to-state");
    symlink(s, &link).unwrap();
    let out = agentd(
        &d,
        &["import", "openclaw", &link.display().to_string(), "--apply"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a symlink"));

    let (report, _) = import(&d, s, true);
    for refused in [
        "workspace/memory/leak.md: a symlink (refused",
        "workspace/MEMORY.md: a symlink (refused",
        "workspace/skills/evil: a symlink (refused",
        "session id \"../../../../etc/passwd\" is not a plain id (refused)",
        "0b0b0b0b-0000-4000-8000-000000000000.jsonl: a symlink (refused",
        "workspace/memory/huge.md: 11534336 bytes, over the limit",
    ] {
        assert!(report.contains(refused), "{refused:?} missing:\n{report}");
    }
    // The rest still arrives, and nothing from outside does.
    assert!(report.contains("imported      agent:main:main"), "{report}");
    let written = snapshot(d.dir.path());
    let leaked = written
        .iter()
        .find(|(_, bytes)| String::from_utf8_lossy(bytes).contains("TOP-SECRET"));
    assert!(leaked.is_none(), "{leaked:?}");
}
