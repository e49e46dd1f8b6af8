//! The command line for scripts and people (issue 33 item 8), through the real binaries: every
//! binary's `--help` lists its exit codes, `--version` names the commit and the features,
//! `agentd completions bash|zsh|fish` prints a script, and `check-config`, `check-config
//! --diff` and `doctor` print one JSON document with `--json`.

use std::process::{Command, Output};

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Wire};

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env_remove("AGENTD_CONFIG")
        .env_remove("AGENTD_STATE_DIR")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `agentd <args> -c <config>` with the daemon's state directory.
fn agentd(d: &TestDaemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(args)
        .arg("-c")
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .env_remove("AGENTD_CONFIG")
        .output()
        .unwrap()
}

/// One JSON document on stdout, nothing else.
fn json_doc(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr: {}",
            stdout(out),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn every_binary_lists_its_exit_codes_in_help() {
    for program in [
        env!("CARGO_BIN_EXE_agentd"),
        env!("CARGO_BIN_EXE_agent-send"),
        env!("CARGO_BIN_EXE_bench"),
    ] {
        let out = run(program, &["--help"]);
        let help = stdout(&out);
        assert!(out.status.success(), "{program} --help: {out:?}");
        let codes = help
            .split_once("Exit codes:")
            .unwrap_or_else(|| panic!("{program} --help lists no exit codes:\n{help}"))
            .1;
        for code in ["  0  ", "  1  ", "  2  "] {
            assert!(codes.contains(code), "{program}: no {code:?} in\n{codes}");
        }
    }
    let agentd = stdout(&run(env!("CARGO_BIN_EXE_agentd"), &["--help"]));
    assert!(
        agentd.contains("  3  the daemon failed while running"),
        "{agentd}"
    );
    let send = stdout(&run(env!("CARGO_BIN_EXE_agent-send"), &["--help"]));
    assert!(send.contains("  3  timed out"), "{send}");
}

#[test]
fn version_names_the_commit_and_the_features() {
    let git = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| stdout(&o).trim().to_string());
    let commit = git.as_deref().unwrap_or("unknown");
    for (program, name) in [
        (env!("CARGO_BIN_EXE_agentd"), "agentd"),
        (env!("CARGO_BIN_EXE_agent-send"), "agent-send"),
        (env!("CARGO_BIN_EXE_bench"), "bench"),
    ] {
        let out = run(program, &["--version"]);
        let v = stdout(&out);
        eprintln!("{v}");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            v.trim(),
            format!(
                "{name} {} (commit {commit}, features: none)",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F _agentd"),
        ("zsh", "#compdef agentd"),
        ("fish", "complete -c agentd"),
    ] {
        let out = run(env!("CARGO_BIN_EXE_agentd"), &["completions", shell]);
        let script = stdout(&out);
        eprintln!("{shell}: {} bytes", script.len());
        assert!(out.status.success(), "{shell}: {out:?}");
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        // fish writes long flags as `-l json`.
        for word in ["check-config", "doctor", "completions", "json"] {
            assert!(script.contains(word), "{shell}: no {word:?}");
        }
    }
    let out = run(env!("CARGO_BIN_EXE_agentd"), &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn check_config_diff_and_doctor_print_one_json_document() {
    // A config that does not load: the problems as JSON, exit 1.
    let bad = TestDaemon::new(
        &agentd_toml("fake").replace("[behavior]", "[behavior]\nmax_turns_per_message = \"many\""),
        &[("fake", &provider_toml("openai", "http://127.0.0.1:9/v1"))],
    );
    for args in [
        &["check-config", "--json"][..],
        &["check-config", "--diff", "--json"],
        &["doctor", "--json"],
    ] {
        let out = agentd(&bad, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let doc = json_doc(&out);
        assert_eq!(doc["ok"], false, "{doc}");
        assert!(
            doc["problems"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["key"] == "behavior.max_turns_per_message"
                    && p["message"].as_str().is_some()
                    && p["file"].as_str().unwrap().ends_with("agentd.toml")),
            "{doc}"
        );
    }

    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    let out = agentd(&d, &["check-config", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let doc = json_doc(&out);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["effective"]["agent"]["name"], "testbot", "{doc}");
    assert_eq!(
        doc["effective"]["behavior"]["call_deadline_seconds"], 900,
        "{doc}"
    );
    assert_eq!(
        doc["models"]["loaded"],
        serde_json::json!(["primary"]),
        "{doc}"
    );
    assert!(doc["config"].as_str().unwrap().ends_with("agentd.toml"));

    // No daemon to compare against: the reason as JSON, exit 1.
    let out = agentd(&d, &["check-config", "--diff", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc = json_doc(&out);
    assert_eq!(doc["ok"], false);
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("no agentd is running"),
        "{doc}"
    );

    d.start();
    let text = std::fs::read_to_string(&d.config_path).unwrap();
    std::fs::write(
        &d.config_path,
        text.replace(
            "[behavior]",
            "[budget]\ndaily_usd = 7.5\n\n[fifo]\nmax_line_bytes = 9000\n\n[behavior]",
        ),
    )
    .unwrap();
    let out = agentd(&d, &["check-config", "--diff", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let doc = json_doc(&out);
    eprintln!("{doc}");
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["pid"].as_u64(), d.pid().map(u64::from), "{doc}");
    let changes = doc["changes"].as_array().unwrap();
    let change = |key: &str| {
        changes
            .iter()
            .find(|c| c["key"] == key)
            .unwrap_or_else(|| panic!("no {key} in {doc}"))
    };
    assert_eq!(change("budget.daily_usd")["applies"], "live");
    assert_eq!(change("budget.daily_usd")["new"], "7.5");
    assert_eq!(change("fifo.max_line_bytes")["applies"], "restart");

    let out = agentd(&d, &["doctor", "--json"]);
    let doc = json_doc(&out);
    eprintln!("doctor: {:?} {doc}", out.status.code());
    let checks = doc["checks"].as_array().unwrap();
    assert!(!checks.is_empty());
    for c in checks {
        assert!(c["name"].is_string() && c["detail"].is_string(), "{c}");
        assert!(
            ["pass", "warn", "fail"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
    }
    let failed = checks.iter().any(|c| c["status"] == "fail");
    assert_eq!(doc["ok"], !failed);
    assert_eq!(out.status.success(), !failed, "{out:?}");
}
