//! Upgrading the config (SPEC §24): a renamed key still loads, with a warning naming its new
//! form, and `agentd check-config --migrate` rewrites the file, keeping values and comments,
//! with a copy of the old one beside it.

use crate::memory::agentd;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};

#[test]
fn a_renamed_key_warns_and_migrate_rewrites_the_file() {
    let old = format!(
        "{}\n[routing]\n# the scheduler's jobs on the main model\nscheduler = \"primary\"\n",
        agentd_toml("fake")
    );
    let d = TestDaemon::new(
        &old,
        &[("fake", &provider_toml("anthropic", "http://127.0.0.1:9"))],
    );
    let out = agentd(&d, &["check-config"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ")
            && stderr.contains("routing.scheduler: renamed to routing.system"),
        "{stderr}"
    );
    let before = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(before.contains("system = \"primary\""), "{before}");

    let out = agentd(&d, &["check-config", "--migrate"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("routing.scheduler -> routing.system (= \"primary\")"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&d.config_path).unwrap();
    assert!(
        text.contains("# the scheduler's jobs on the main model\nsystem = \"primary\""),
        "{text}"
    );
    let copies: Vec<_> = std::fs::read_dir(d.config_path.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("agentd.toml.before-migrate-")
        })
        .collect();
    assert_eq!(copies.len(), 1);
    assert_eq!(std::fs::read_to_string(copies[0].path()).unwrap(), old);

    // The rewritten file loads without a warning, to the same effective configuration.
    let out = agentd(&d, &["check-config"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
    let after = String::from_utf8_lossy(&out.stdout);
    assert_eq!(after, before);
}
