//! Outside input on the intake path is validated and bounded (SPEC §16.9, issue 12 findings
//! 9, 10, 12 and 15): FIFO fragments, `text_file`, client ids and queue caps.

use std::io::Write;
use std::time::Duration;

use crate::daemon_e2e::daemon_with;
use crate::support::fake_llm::{FakeLlm, Wire};

/// A fragment without a newline (`echo -n`, a writer killed mid-line) is dropped after a short
/// wait and logged; the next writer's complete line is not glued to it and is answered.
#[test]
fn fifo_fragment_is_dropped_and_next_line_accepted() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.state_dir.join("control.pipe"))
            .expect("open control.pipe");
        f.write_all(br#"{"id":"frag","type":"user","text":"half a li"#)
            .expect("write fragment");
    }
    // Longer than the daemon's fragment wait (2 s).
    std::thread::sleep(Duration::from_secs(3));
    let out = d.agent_send(&["-m", "after the fragment", "--from", "ivy", "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("after the fragment"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let log = d.log();
    assert!(
        log.contains("FIFO fragment without a newline discarded"),
        "{log}"
    );
    assert!(
        d.trail("ivy").iter().all(|l| l["id"] != "frag"),
        "the fragment never became a message"
    );
}
