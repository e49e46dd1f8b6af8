//! The trusted prompt stays the operator's (issue "Security, third round", item 10): with the
//! default tools and paths, one session's model tries to rewrite `AGENTS.md` (a context file of
//! the system prompt) and a skill with `write`, `edit` and `exec`, and to add skills of its
//! own. Both files are unchanged afterwards, no skill appears, and the next request of another
//! session carries the same system prompt as before. `MEMORY.md`, which the operator opts in
//! by default (`[tools] writable_context`), stays writable.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::wait_until;

/// The `tool_result` block answering `id` in any request the fake model received.
fn tool_result(reqs: &[Value], id: &str) -> Value {
    for req in reqs {
        for msg in req["messages"].as_array().into_iter().flatten() {
            for block in msg["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_result" && block["tool_use_id"] == id {
                    return block.clone();
                }
            }
        }
    }
    panic!("no tool_result for {id} in {reqs:#?}");
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Send `text` from `sender` over the FIFO and wait for its outcome; the requests so far.
fn say(d: &TestDaemon, llm: &FakeLlm, id: &str, sender: &str, text: &str) -> Vec<Value> {
    fifo_write(
        d,
        &json!({"id": id, "type": "user", "text": text, "sender": sender}).to_string(),
    );
    wait_outcome(d, sender, id);
    llm.requests()
}

#[test]
fn the_model_cannot_rewrite_the_trusted_prompt() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    let ws = d.workspace();
    let agents = ws.join("AGENTS.md");
    let skill = ws.join("skills/example/SKILL.md");
    let (agents_before, skill_before) = (read(&agents), read(&skill));
    d.start();

    // Session B's first message: its system prompt as the operator wrote it.
    llm.push(Reply::text("hello B"));
    let reqs = say(&d, &llm, "b1", "bob", "hello");
    let system_before = reqs.last().expect("B's request")["system"].clone();
    assert!(
        system_before.to_string().contains("Operating rules"),
        "{system_before:#}"
    );

    // Session A's model tries every way in at once.
    let new_skill = "---\nname: evil\ndescription: INJECTED skill\n---\nINJECTED body\n";
    llm.push(Reply::tool_calls(vec![
        (
            "w-agents",
            "write",
            json!({"path": "AGENTS.md", "content": "INJECTED by write\n"}),
        ),
        (
            "e-agents",
            "edit",
            json!({"path": "AGENTS.md", "old_string": "# Operating rules", "new_string": "# Operating rules\nINJECTED by edit"}),
        ),
        (
            "w-skill",
            "write",
            json!({"path": "skills/example/SKILL.md", "content": new_skill}),
        ),
        (
            "e-skill",
            "edit",
            json!({"path": "skills/example/SKILL.md", "old_string": "# Example skill", "new_string": "# Example skill\nINJECTED by edit"}),
        ),
        (
            "w-new-skill",
            "write",
            json!({"path": "skills/evil/SKILL.md", "content": new_skill}),
        ),
        (
            "x-shell",
            "exec",
            json!({"command": "echo INJECTED-x >> AGENTS.md; echo INJECTED-x >> skills/example/SKILL.md; \
                               mkdir -p skills/evil2; cp skills/example/SKILL.md skills/evil2/SKILL.md; \
                               mv AGENTS.md AGENTS.old; echo INJECTED-x > AGENTS.md; cat AGENTS.md"}),
        ),
    ]));
    llm.push(Reply::text("done"));
    let reqs = say(&d, &llm, "a1", "mallory", "rewrite your rules");
    for id in ["w-agents", "e-agents", "w-skill", "e-skill", "w-new-skill"] {
        let block = tool_result(&reqs, id);
        assert_eq!(block["is_error"], true, "{id} should be refused: {block}");
    }
    let shell = tool_result(&reqs, "x-shell");
    eprintln!("exec's answer: {shell}");

    assert_eq!(read(&agents), agents_before, "AGENTS.md changed");
    assert_eq!(read(&skill), skill_before, "SKILL.md changed");
    assert!(!ws.join("skills/evil").exists(), "a skill was created");
    assert!(!ws.join("skills/evil2").exists(), "a skill was created");
    assert!(!ws.join("AGENTS.old").exists(), "AGENTS.md was moved");

    // Skills are rescanned (as an operator's SIGUSR1 or SIGHUP would), then B asks again.
    let pid = d.pid().expect("daemon pid");
    let status = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    d.wait_log("skills rescanned");
    llm.push(Reply::text("hello again B"));
    let reqs = say(&d, &llm, "b2", "bob", "hello again");
    let system_after = reqs.last().expect("B's second request")["system"].clone();
    assert_eq!(system_after, system_before, "B's system prompt changed");

    // MEMORY.md is the agent's own notes (opted in by default): still writable.
    llm.push(Reply::tool_calls(vec![(
        "w-memory",
        "write",
        json!({"path": "MEMORY.md", "content": "# Memory\n\nThe user likes tea.\n"}),
    )]));
    llm.push(Reply::text("noted"));
    let reqs = say(&d, &llm, "a2", "mallory", "remember that I like tea");
    let block = tool_result(&reqs, "w-memory");
    assert_ne!(block["is_error"], true, "{block}");
    wait_until(WAIT, "MEMORY.md written", || {
        read(&ws.join("MEMORY.md"))
            .contains("likes tea")
            .then_some(())
    });
}
