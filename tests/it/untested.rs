//! Behaviour that was implemented before it was tested (issue #13, "implemented but
//! untested"): the state directories' 0700 modes and the daily log files' rotation.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Wire};
use crate::support::wait_until;

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The state root and the directories the daemon keeps in it.
fn state_dirs(d: &TestDaemon) -> [PathBuf; 4] {
    [
        d.state_dir.clone(),
        d.state_dir.join("sessions"),
        d.state_dir.join("inbox"),
        d.state_dir.join("logs"),
    ]
}

fn daemon(fake: &FakeLlm, logging: &str) -> TestDaemon {
    TestDaemon::new(
        &agentd_toml("fake").replace("[logging]\nfile = false", logging),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    )
}

/// A first start under a typical umask (022) creates the state root, `sessions/`, `inbox/` and
/// `logs/` with mode 0700.
#[test]
fn state_directories_are_created_0700() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon(&fake, "[logging]\nfile = true");
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    d.start();
    nix::sys::stat::umask(old);
    for dir in state_dirs(&d) {
        assert_eq!(mode_of(&dir), 0o700, "{}", dir.display());
    }
    d.sigterm();
}

/// State directories made by hand with wider modes (0755, 0777) are tightened to 0700 at
/// start, each of them, not only the root.
#[test]
fn wide_state_subdirectories_are_tightened() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon(&fake, "[logging]\nfile = false");
    let dirs = state_dirs(&d);
    for (dir, mode) in dirs.iter().zip([0o755, 0o750, 0o777, 0o755]) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    d.start();
    for dir in &dirs {
        assert_eq!(mode_of(dir), 0o700, "{}", dir.display());
    }
    d.sigterm();
}

/// Log rotation: daily files `logs/agentd.<YYYY-MM-DD>.log`; at start the oldest are deleted so
/// that `keep_files` remain with today's, and other files in `logs/` are left alone.
#[test]
fn old_daily_log_files_are_pruned_to_keep_files() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon(&fake, "[logging]\nfile = true\nkeep_files = 3");
    let logs = d.state_dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let old = [
        "agentd.2026-01-01.log",
        "agentd.2026-01-02.log",
        "agentd.2026-01-03.log",
        "agentd.2026-01-04.log",
        "agentd.2026-01-05.log",
    ];
    // Created oldest first (the appender orders by creation time, else by the name's date).
    for name in old {
        std::fs::write(logs.join(name), format!("{name}\n")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(logs.join("notes.txt"), "mine\n").unwrap();
    d.start();
    let today = format!("agentd.{}.log", chrono::Utc::now().format("%Y-%m-%d"));
    let names = wait_until(Duration::from_secs(10), "today's log file", || {
        let mut names: Vec<String> = std::fs::read_dir(&logs)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.contains(&today).then_some(names)
    });
    let mut want = vec![
        "agentd.2026-01-04.log".to_string(),
        "agentd.2026-01-05.log".to_string(),
        today.clone(),
        "notes.txt".to_string(),
    ];
    want.sort();
    assert_eq!(
        names, want,
        "keep_files = 3: the two newest old files and today's"
    );
    // Today's file is the one written to.
    wait_until(Duration::from_secs(10), "a line in today's log", || {
        let text = std::fs::read_to_string(logs.join(&today)).ok()?;
        (!text.is_empty()).then_some(())
    });
    d.sigterm();
}
