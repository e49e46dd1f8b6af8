//! OpenClaw's workspace (`workspace/`): long-term memory (`MEMORY.md`, `memory/*.md`) into
//! agentd's workspace, where the memory index reads it, and skills (`skills/<name>/SKILL.md`,
//! also the managed ones in the state directory's `skills/`) into agentd's skills directory,
//! checked as agentd's skill scanner reads them. Nothing of agentd's is ever overwritten.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::source::Source;
use super::{Item, Report, Section};
use crate::config::Config;

/// A note larger than this is skipped (the memory indexer's own limit).
const MAX_NOTE_BYTES: u64 = 10 * 1024 * 1024;
/// Notes of `memory/` read at most.
const MAX_NOTES: usize = 10_000;
/// Skills read at most (per skills directory).
const MAX_SKILLS: usize = 1_000;
/// A SKILL.md larger than this is skipped (agentd's scanner skips it too).
const MAX_SKILL_BYTES: u64 = 256 * 1024;

/// Memory notes: `workspace/MEMORY.md` and `workspace/memory/*.md`.
pub fn memory(src: &Source, cfg: &Config, r: &mut Report) {
    let ws = &cfg.agent.workspace;
    let mut notes = vec![(PathBuf::from("workspace/MEMORY.md"), ws.join("MEMORY.md"))];
    let dir = Path::new("workspace/memory");
    match src.list(dir, MAX_NOTES) {
        Ok(entries) => {
            for e in entries.into_iter().filter(|e| e.name.ends_with(".md")) {
                if e.is_symlink {
                    r.skip(
                        Section::Memory,
                        &format!("{}/{}", dir.display(), e.name),
                        super::SYMLINK,
                    );
                } else if e.is_file && !e.name.starts_with('.') {
                    notes.push((dir.join(&e.name), ws.join("memory").join(&e.name)));
                }
            }
        }
        Err(why) => r.skip(Section::Memory, &dir.display().to_string(), why),
    }
    for (rel, dest) in notes {
        let shown = rel.display().to_string();
        let bytes = match src.read(&rel, MAX_NOTE_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => continue,
            Err(why) => {
                r.skip(Section::Memory, &shown, why);
                continue;
            }
        };
        // agentd's own MEMORY.md stays; OpenClaw's goes beside the notes.
        let mut places = vec![dest];
        if rel.ends_with("MEMORY.md") {
            places.push(ws.join("memory/openclaw-MEMORY.md"));
        }
        if places
            .iter()
            .any(|p| std::fs::read(p).is_ok_and(|b| b == bytes))
        {
            r.skip(Section::Memory, &shown, "already in the workspace");
            continue;
        }
        let Some(dest) = places.into_iter().find(|p| !p.exists()) else {
            r.skip(
                Section::Memory,
                &shown,
                "a note of that name exists with other content; merge it by hand",
            );
            continue;
        };
        let detail = format!("-> {}", dest.display());
        if !r.apply {
            r.add(Item::would(Section::Memory, shown, detail));
            continue;
        }
        match write_new(&dest, &bytes) {
            Ok(()) => {
                r.notes_written += 1;
                r.add(Item::done(Section::Memory, shown, detail));
            }
            Err(e) => r.skip(
                Section::Memory,
                &shown,
                format!("cannot write {}: {e}", dest.display()),
            ),
        }
    }
}

/// Create `dest` (and its directory) with `bytes`, durably; never replaces a file.
fn write_new(dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if dest.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "exists",
        ));
    }
    crate::fsutil::atomic_write(dest, bytes)
}

/// Skills: `workspace/skills/*/SKILL.md`, then the managed `skills/*/SKILL.md`.
pub fn skills(src: &Source, cfg: &Config, r: &mut Report) {
    let dest_dir = &cfg.agent.skills.dir;
    let mut imported = Vec::new();
    for dir in ["workspace/skills", "skills"] {
        let entries = match src.list(Path::new(dir), MAX_SKILLS) {
            Ok(e) => e,
            Err(why) => {
                r.skip(Section::Skills, dir, why);
                continue;
            }
        };
        for e in entries {
            let shown = format!("{dir}/{}", e.name);
            if e.is_symlink {
                r.skip(Section::Skills, &shown, super::SYMLINK);
            } else if e.is_dir && is_plain_name(&e.name) {
                let rel = Path::new(dir).join(&e.name).join("SKILL.md");
                if let Some(name) = skill(src, &rel, &dest_dir.join(&e.name), r) {
                    imported.push(name);
                }
            } else if e.is_dir {
                r.skip(Section::Skills, &shown, "not a plain directory name");
            }
        }
    }
    if r.apply && !imported.is_empty() {
        // What the daemon will load: agentd's own scanner over the skills directory.
        let found: Vec<String> = crate::skills::scan(dest_dir)
            .into_iter()
            .map(|s| s.name)
            .collect();
        for name in imported.iter().filter(|n| !found.contains(*n)) {
            r.skip(
                Section::Skills,
                name,
                "copied, but agentd's skill scanner does not load it (see the log)",
            );
        }
    }
}

fn is_plain_name(name: &str) -> bool {
    !name.starts_with('.')
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// One skill: read, frontmatter made agentd's (`name`, `description`, `triggers`; other keys
/// dropped and listed), checked with `skills::parse_skill`, copied when applying. Only
/// `SKILL.md` is copied: scripts and references beside it are listed for the user.
fn skill(src: &Source, rel: &Path, dest: &Path, r: &mut Report) -> Option<String> {
    let shown = rel.display().to_string();
    let text = match src.read_text(rel, MAX_SKILL_BYTES) {
        Ok(Some(t)) => t,
        Ok(None) => {
            r.skip(Section::Skills, &shown, "no SKILL.md");
            return None;
        }
        Err(why) => {
            r.skip(Section::Skills, &shown, why);
            return None;
        }
    };
    let (text, dropped) = match agentd_frontmatter(&text) {
        Ok(t) => t,
        Err(why) => {
            r.skip(Section::Skills, &shown, why);
            return None;
        }
    };
    let name = match crate::skills::parse_skill(&text) {
        Ok((name, ..)) => name,
        Err(why) => {
            r.skip(Section::Skills, &shown, why);
            return None;
        }
    };
    if dest.exists() {
        r.skip(
            Section::Skills,
            &shown,
            format!("{} exists", dest.display()),
        );
        return None;
    }
    let mut detail = format!("{name} -> {}", dest.join("SKILL.md").display());
    if !dropped.is_empty() {
        detail.push_str(&format!(
            " (frontmatter keys agentd does not read, dropped: {})",
            dropped.join(", ")
        ));
    }
    let others = rel
        .parent()
        .and_then(|d| src.list(d, MAX_SKILLS).ok())
        .map_or(0, |e| e.len());
    if others > 1 {
        detail.push_str(&format!(
            "; {} other file(s) of the skill not copied",
            others - 1
        ));
    }
    if !r.apply {
        r.add(Item::would(Section::Skills, shown, detail));
        return None;
    }
    match write_new(&dest.join("SKILL.md"), text.as_bytes()) {
        Ok(()) => {
            r.add(Item::done(Section::Skills, shown, detail));
            Some(name)
        }
        Err(e) => {
            r.skip(Section::Skills, &shown, format!("cannot write: {e}"));
            None
        }
    }
}

/// The frontmatter agentd reads: `SKILL.md` as it is when `skills::parse_skill` takes it,
/// else with the frontmatter rewritten to `name`, `description` and `triggers` (the keys it
/// dropped are returned).
fn agentd_frontmatter(text: &str) -> Result<(String, Vec<String>), String> {
    if crate::skills::parse_skill(text).is_ok() {
        return Ok((text.to_string(), Vec::new()));
    }
    let rest = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = rest
        .strip_prefix("---\n")
        .ok_or("SKILL.md must start with a `---` frontmatter line")?;
    let (yaml, body) = rest
        .split_once("\n---")
        .ok_or("frontmatter is not closed with `---`")?;
    let fm: BTreeMap<String, serde_json::Value> =
        serde_saphyr::from_str(yaml).map_err(|e| format!("frontmatter: {e}"))?;
    let field = |k: &str| {
        fm.get(k)
            .and_then(|v| v.as_str())
            .map(str::trim)
            .unwrap_or("")
    };
    let (name, description) = (field("name"), field("description"));
    if name.is_empty() || description.is_empty() {
        return Err("frontmatter needs a non-empty `name` and `description`".into());
    }
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut out = format!("---\nname: {}\ndescription: {}\n", q(name), q(description));
    if let Some(serde_json::Value::Array(t)) = fm.get("triggers") {
        let t: Vec<String> = t.iter().filter_map(|v| v.as_str()).map(q).collect();
        out.push_str(&format!("triggers: [{}]\n", t.join(", ")));
    }
    out.push_str("---");
    out.push_str(body.trim_start_matches(|c| c != '\n'));
    let dropped = fm
        .keys()
        .filter(|k| !["name", "description", "triggers"].contains(&k.as_str()));
    Ok((out, dropped.cloned().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openclaw_frontmatter_keys_are_dropped_and_listed() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/openclaw/state/workspace/skills/weather/SKILL.md");
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            crate::skills::parse_skill(&text).is_err(),
            "agentd refuses the original"
        );
        let (out, dropped) = agentd_frontmatter(&text).unwrap();
        assert_eq!(dropped, ["homepage", "metadata"]);
        let (name, description, _, body) = crate::skills::parse_skill(&out).unwrap();
        assert_eq!(name, "weather");
        assert_eq!(
            description,
            "Get current weather and forecasts (no API key required)."
        );
        assert!(
            body.starts_with("# Weather") && body.contains("wttr.in"),
            "{body}"
        );
    }
}
