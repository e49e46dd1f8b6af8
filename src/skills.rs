//! Skills (SPEC §11 `load_skill`, issue: tools): `workspace/skills/<dir>/SKILL.md` with YAML
//! frontmatter (`name`, `description`, optional `triggers`), parsed with serde-saphyr. The
//! index goes into the semi_stable prompt tier, `always_on` bodies too; bodies whose trigger
//! appears in a message go into that message's dynamic context; `load_skill` returns a body.
//! Rescanned on SIGHUP and SIGUSR1.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::llm::ToolSpec;
use crate::tools::{Tool, ToolContext, ToolError};

/// Frontmatter larger than this is refused (a skill file is prose, not data).
const MAX_FRONTMATTER: usize = 64 * 1024;
/// SKILL.md files larger than this are skipped.
const MAX_SKILL_BYTES: u64 = 256 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub triggers: Vec<String>,
    pub body: String,
    pub path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Frontmatter {
    name: String,
    description: String,
    #[serde(default)]
    triggers: Vec<String>,
}

/// Split `---\nyaml\n---\nbody` and parse the YAML. Errors name what is wrong.
pub fn parse_skill(text: &str) -> Result<(String, String, Vec<String>, String), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    match lines.next() {
        Some(first) if first.trim_end() == "---" => {}
        _ => return Err("SKILL.md must start with a `---` frontmatter line".into()),
    }
    let mut yaml = String::new();
    let mut closed = false;
    for line in lines.by_ref() {
        let t = line.trim_end();
        if t == "---" || t == "..." {
            closed = true;
            break;
        }
        yaml.push_str(line);
        if yaml.len() > MAX_FRONTMATTER {
            return Err(format!("frontmatter is over {MAX_FRONTMATTER} bytes"));
        }
    }
    if !closed {
        return Err("frontmatter is not closed with `---`".into());
    }
    let body: String = lines.collect();
    let fm: Frontmatter = serde_saphyr::from_str(&yaml).map_err(|e| format!("frontmatter: {e}"))?;
    if fm.name.trim().is_empty() || fm.description.trim().is_empty() {
        return Err("frontmatter needs a non-empty `name` and `description`".into());
    }
    Ok((
        fm.name.trim().to_string(),
        fm.description.trim().to_string(),
        fm.triggers
            .into_iter()
            .map(|t| t.trim().to_lowercase())
            .filter(|t| !t.is_empty())
            .collect(),
        body.trim().to_string(),
    ))
}

/// Every `<dir>/*/SKILL.md`, sorted by name (a stable order: the index is part of the prompt
/// cache). Broken skills are logged and skipped; duplicate names keep the first. A skill
/// directory or a `SKILL.md` that is a symlink is skipped with a warning: it could bring text
/// from anywhere into the system prompt (issue "Security, third round", item 10).
pub fn scan(dir: &Path) -> Vec<Skill> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut skills: Vec<Skill> = Vec::new();
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|e| skill_file(&e.path()))
        .collect();
    paths.sort();
    for path in paths {
        if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) > MAX_SKILL_BYTES {
            tracing::warn!(path = %path.display(), "skill skipped: SKILL.md is too large");
            continue;
        }
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| parse_skill(&t));
        match parsed {
            Ok((name, description, triggers, body)) => {
                if skills.iter().any(|s| s.name == name) {
                    tracing::warn!(path = %path.display(), %name, "skill skipped: duplicate name");
                    continue;
                }
                skills.push(Skill {
                    name,
                    description,
                    triggers,
                    body,
                    path,
                });
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "skill skipped"),
        }
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    skills
}

/// `<entry>/SKILL.md` when `entry` is a real directory holding a regular `SKILL.md`; a
/// symlink on the way is logged and refused, anything else ignored.
fn skill_file(entry: &Path) -> Option<PathBuf> {
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    if is_link(entry) {
        tracing::warn!(path = %entry.display(), "skill skipped: its directory is a symlink (copy the skill into the skills directory instead)");
        return None;
    }
    if !entry.is_dir() {
        return None;
    }
    let file = entry.join("SKILL.md");
    if is_link(&file) {
        tracing::warn!(path = %file.display(), "skill skipped: SKILL.md is a symlink (copy the file instead)");
        return None;
    }
    std::fs::symlink_metadata(&file)
        .is_ok_and(|m| m.is_file())
        .then_some(file)
}

/// The loaded skills, replaceable at runtime (SIGHUP/SIGUSR1).
pub struct SkillSet {
    dir: PathBuf,
    always_on: Vec<String>,
    current: RwLock<Arc<Vec<Skill>>>,
}

impl SkillSet {
    pub fn load(dir: &Path, always_on: &[String]) -> SkillSet {
        let set = SkillSet {
            dir: dir.to_path_buf(),
            always_on: always_on.to_vec(),
            current: RwLock::new(Arc::new(Vec::new())),
        };
        set.rescan();
        set
    }

    /// Re-read the skills directory. Returns how many skills are loaded.
    pub fn rescan(&self) -> usize {
        let skills = scan(&self.dir);
        for name in &self.always_on {
            if !skills.iter().any(|s| &s.name == name) {
                tracing::warn!(skill = %name, "[agent.skills] always_on names a skill that does not exist");
            }
        }
        let n = skills.len();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(skills);
        n
    }

    /// Whether `[agent.skills] always_on` names `name`.
    pub fn is_always_on(&self, name: &str) -> bool {
        self.always_on.iter().any(|n| n == name)
    }

    pub fn all(&self) -> Arc<Vec<Skill>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Text for the semi_stable tier: `always_on` bodies and the index of the others, without
    /// the skills a session turned `off` (SPEC §18.2).
    pub fn semi_stable_text(&self, off: &BTreeSet<String>) -> String {
        let all = self.all();
        let skills: Vec<&Skill> = all.iter().filter(|s| !off.contains(&s.name)).collect();
        if skills.is_empty() {
            return String::new();
        }
        let mut out = Vec::new();
        for s in skills.iter().filter(|s| self.always_on.contains(&s.name)) {
            out.push(format!("--- SKILL {} ---\n{}", s.name, s.body));
        }
        let mut index = String::from(
            "--- SKILLS ---\nSkills you can load with the load_skill tool when a task needs one:",
        );
        for s in skills.iter() {
            index.push_str(&format!("\n- {}: {}", s.name, s.description));
        }
        out.push(index);
        out.join("\n\n")
    }

    /// Bodies of skills whose trigger appears in `text` (case-insensitive), excluding
    /// `always_on` ones (already in the prompt) and those the session turned `off`.
    pub fn triggered(&self, text: &str, off: &BTreeSet<String>) -> Vec<Skill> {
        let lower = text.to_lowercase();
        self.all()
            .iter()
            .filter(|s| !self.always_on.contains(&s.name) && !off.contains(&s.name))
            .filter(|s| s.triggers.iter().any(|t| lower.contains(t.as_str())))
            .cloned()
            .collect()
    }
}

/// `load_skill(name)`: the skill's body.
pub struct LoadSkillTool {
    pub skills: Arc<SkillSet>,
}

impl Tool for LoadSkillTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "load_skill".into(),
            description:
                "Load a skill's instructions by name (see the SKILLS index in your prompt).".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1, "description": "Skill name from the index."}},
                "required": ["name"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let name = args["name"].as_str().unwrap_or_default();
            let all = self.skills.all();
            match all.iter().find(|s| s.name == name) {
                Some(s) => Ok(format!("--- SKILL {} ---\n{}", s.name, s.body)),
                None => Err(ToolError::Invalid(format!(
                    "no skill named {name:?}; available: {}",
                    all.iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_skill(dir: &Path, sub: &str, text: &str) {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join("SKILL.md"), text).unwrap();
    }

    #[test]
    fn parses_frontmatter_and_body() {
        let (n, d, t, b) = parse_skill(
            "---\nname: deploy\ndescription: Ship it\ntriggers: [\"Deploy Now\", release]\n---\n\n# Steps\n1. go\n",
        )
        .unwrap();
        assert_eq!((n.as_str(), d.as_str()), ("deploy", "Ship it"));
        assert_eq!(t, ["deploy now", "release"]);
        assert_eq!(b, "# Steps\n1. go");
    }

    #[test]
    fn rejects_broken_frontmatter() {
        assert!(parse_skill("no frontmatter").is_err());
        assert!(parse_skill("---\nname: x\n").is_err());
        assert!(parse_skill("---\nname: x\ndescription: y\nbogus: 1\n---\n").is_err());
        assert!(parse_skill("---\nname: x\n---\nbody").is_err());
        assert!(parse_skill("---\n: [unclosed\n---\n").is_err());
    }

    #[test]
    fn index_always_on_and_triggers() {
        let d = tempfile::tempdir().unwrap();
        write_skill(
            d.path(),
            "b",
            "---\nname: beta\ndescription: B skill\ntriggers: [weather]\n---\nbeta body",
        );
        write_skill(
            d.path(),
            "a",
            "---\nname: alpha\ndescription: A skill\n---\nalpha body",
        );
        write_skill(d.path(), "c", "not a skill");
        let set = SkillSet::load(d.path(), &["alpha".to_string()]);
        assert_eq!(set.all().len(), 2);
        let none = BTreeSet::new();
        let text = set.semi_stable_text(&none);
        assert!(text.starts_with("--- SKILL alpha ---\nalpha body"));
        assert!(text.contains("- alpha: A skill\n- beta: B skill"));
        assert_eq!(
            set.triggered("What's the WEATHER like?", &none)[0].name,
            "beta"
        );
        assert!(set.triggered("hello", &none).is_empty());
        // A session that turned both off: no body, no index line, no trigger (SPEC §18.2).
        let off = BTreeSet::from(["alpha".to_string(), "beta".to_string()]);
        assert_eq!(set.semi_stable_text(&off), "");
        assert!(set.triggered("weather", &off).is_empty());
        let beta_off = BTreeSet::from(["beta".to_string()]);
        let text = set.semi_stable_text(&beta_off);
        assert!(
            text.contains("alpha body") && !text.contains("beta"),
            "{text}"
        );
        write_skill(d.path(), "g", "---\nname: gamma\ndescription: G\n---\ng");
        assert_eq!(set.rescan(), 3);
    }

    /// Issue "Security, third round", item 10: a skill directory or a SKILL.md that is a
    /// symlink (here to a directory outside the skills directory) is not loaded.
    #[test]
    fn symlinked_skills_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let skills = d.path().join("skills");
        let outside = d.path().join("outside");
        write_skill(
            &skills,
            "real",
            "---\nname: real\ndescription: R\n---\nreal body",
        );
        write_skill(
            &outside,
            "evil",
            "---\nname: evil\ndescription: E\n---\nINJECTED",
        );
        std::os::unix::fs::symlink(outside.join("evil"), skills.join("linked-dir")).unwrap();
        std::fs::create_dir_all(skills.join("linked-file")).unwrap();
        std::os::unix::fs::symlink(
            outside.join("evil/SKILL.md"),
            skills.join("linked-file/SKILL.md"),
        )
        .unwrap();
        let names: Vec<String> = scan(&skills).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["real"]);
    }
}
