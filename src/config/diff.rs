//! What changed between two configurations, and which changes apply live on SIGHUP (SPEC §16.5).
//!
//! Both sides are compared as [`render_effective`](super::render_effective) renders them, so
//! `agentd check-config --diff` (against the file the running daemon wrote) and the daemon's
//! own reload agree on what changed. Secrets are redacted in that text: a changed secret value
//! is not seen here (the reload compares MCP servers whole, secrets included).
//!
//! Which keys apply live is declared in the key table (`keys`, see [`applies_live`]); the same
//! declaration makes `Config::with_live_parts_of` copy them. Workspace files and the skills in
//! the skills directory are re-read on every SIGHUP whatever the diff says.

use std::collections::BTreeMap;

/// One changed key, e.g. `budget.daily_usd` or `schedule.nightly`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `table.key`; a `[[schedule]]` entry is `schedule.<name>` with its lines as the value.
    pub key: String,
    /// `None`: added.
    pub old: Option<String>,
    /// `None`: removed.
    pub new: Option<String>,
}

impl Change {
    /// Whether a SIGHUP applies this change (else it needs a restart).
    pub fn applies_live(&self) -> bool {
        applies_live(&self.key)
    }
}

/// Whether a change of `key` applies on SIGHUP: as the key table declares it
/// (`keys::applies_live`); anything not declared live needs a restart.
pub fn applies_live(key: &str) -> bool {
    super::keys::applies_live(key)
}

/// The changes from `old` to `new`, both texts of `render_effective`, sorted by key.
pub fn diff_rendered(old: &str, new: &str) -> Vec<Change> {
    let (old, new) = (keyed(old), keyed(new));
    let mut out = Vec::new();
    for (k, v) in &old {
        match new.get(k) {
            Some(n) if n == v => {}
            Some(n) => out.push(Change {
                key: k.clone(),
                old: Some(v.clone()),
                new: Some(n.clone()),
            }),
            None => out.push(Change {
                key: k.clone(),
                old: Some(v.clone()),
                new: None,
            }),
        }
    }
    for (k, v) in &new {
        if !old.contains_key(k) {
            out.push(Change {
                key: k.clone(),
                old: None,
                new: Some(v.clone()),
            });
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// `table.key → value` for every `key = value` line; each `[[schedule]]` entry becomes one key
/// (`schedule.<name>`) whose value is its lines joined. Comments and blank lines are skipped,
/// except that a `# name = …` comment-line inside a table counts as its value (the renderer
/// writes unset keys like `# tools = (not set)` and secrets that way), and a `# [table]`
/// comment-line opens a table (the renderer comments out the models of the provider files).
fn keyed(text: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut table = String::new();
    let mut entry: Option<(String, Vec<String>)> = None;
    let flush = |map: &mut BTreeMap<String, String>, entry: &mut Option<(String, Vec<String>)>| {
        if let Some((name, lines)) = entry.take() {
            map.insert(format!("schedule.{name}"), lines.join("; "));
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            flush(&mut map, &mut entry);
            table = name.to_string();
            entry = (name == "schedule").then(|| (String::new(), Vec::new()));
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            flush(&mut map, &mut entry);
            table = name.to_string();
            continue;
        }
        if let Some(name) = line
            .strip_prefix('#')
            .map(str::trim)
            .and_then(|l| l.strip_prefix('['))
            .and_then(|l| l.strip_suffix(']'))
            .filter(|n| !n.starts_with('['))
        {
            flush(&mut map, &mut entry);
            table = name.to_string();
            continue;
        }
        let (k, v) = match line.strip_prefix('#') {
            Some(c) => match c.trim().split_once(" = ") {
                Some((k, v)) if !k.contains(' ') => (k.trim(), v.trim()),
                _ => continue,
            },
            None => match line.split_once(" = ") {
                Some((k, v)) => (k.trim(), v.trim()),
                None => continue,
            },
        };
        match &mut entry {
            Some((name, lines)) => {
                if k == "name" {
                    *name = v.trim_matches('"').to_string();
                }
                lines.push(format!("{k} = {v}"));
            }
            None => {
                map.insert(format!("{table}.{k}"), v.to_string());
            }
        }
    }
    flush(&mut map, &mut entry);
    map
}

/// The changes as text for people: live ones first, then those that need a restart.
pub fn describe(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "no changes\n".to_string();
    }
    let mut out = String::new();
    let (live, restart): (Vec<&Change>, Vec<&Change>) =
        changes.iter().partition(|c| c.applies_live());
    let line = |c: &Change| match (&c.old, &c.new) {
        (None, Some(n)) => format!("  + {} = {n}\n", c.key),
        (Some(o), None) => format!("  - {} (was {o})\n", c.key),
        (Some(o), Some(n)) => format!("  ~ {}: {o} -> {n}\n", c.key),
        (None, None) => String::new(),
    };
    if !live.is_empty() {
        out.push_str("applies live on reload (SIGHUP, `systemctl reload agentd`):\n");
        live.iter().for_each(|c| out.push_str(&line(c)));
    }
    if !restart.is_empty() {
        out.push_str("needs a restart (`systemctl restart agentd`):\n");
        restart.iter().for_each(|c| out.push_str(&line(c)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"# effective configuration of /x/agentd.toml

[channel.telegram]
enabled = true
allow_from = [1, 2]

[http]
port = 8080

[budget]
daily_usd = 5.0

[mcp.servers.time]
command = "t"
# tools = (not set)

[models]
# [models.primary]
# provider = "anthropic"
# cost_per_mtok.cache_write_1h = 6.0

[[schedule]]
name = "a"
every = "60s"
system = "hi"

[[schedule]]
name = "b"
every = "10s"
system = "x"
"#;

    #[test]
    fn same_text_has_no_changes() {
        assert!(diff_rendered(OLD, OLD).is_empty());
        assert_eq!(describe(&[]), "no changes\n");
    }

    #[test]
    fn changes_are_keyed_and_classified() {
        let new = OLD
            .replace("allow_from = [1, 2]", "allow_from = [1]")
            .replace("port = 8080", "port = 8081")
            .replace("daily_usd = 5.0", "daily_usd = 9.0")
            .replace("# tools = (not set)", "tools = [\"now\"]")
            .replace("cache_write_1h = 6.0", "cache_write_1h = 7.5")
            .replace(
                "name = \"b\"\nevery = \"10s\"\nsystem = \"x\"\n",
                "name = \"c\"\nevery = \"5s\"\nsystem = \"y\"\n",
            );
        let changes = diff_rendered(OLD, &new);
        let keys: Vec<(&str, bool)> = changes
            .iter()
            .map(|c| (c.key.as_str(), c.applies_live()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("budget.daily_usd", true),
                ("channel.telegram.allow_from", true),
                ("http.port", false),
                ("mcp.servers.time.tools", true),
                ("models.primary.cost_per_mtok.cache_write_1h", false),
                ("schedule.b", true),
                ("schedule.c", true),
            ]
        );
        let text = describe(&changes);
        let (live, restart) = text.split_once("needs a restart").unwrap();
        assert!(live.contains("~ budget.daily_usd: 5.0 -> 9.0"), "{text}");
        assert!(
            live.contains("- schedule.b (was name = \"b\"; every = \"10s\"; system = \"x\")"),
            "{text}"
        );
        assert!(live.contains("+ schedule.c = name = \"c\""), "{text}");
        assert!(restart.contains("~ http.port: 8080 -> 8081"), "{text}");
        assert!(
            restart.contains("~ models.primary.cost_per_mtok.cache_write_1h: 6.0 -> 7.5"),
            "{text}"
        );
    }

    #[test]
    fn live_prefixes_match_whole_keys_only() {
        assert!(applies_live("channel.telegram.contacts"));
        assert!(applies_live("mcp.servers.x.env"));
        assert!(!applies_live("channel.telegram.token_env"));
        assert!(!applies_live("budgetx.y"));
        assert!(!applies_live("http.port"));
        assert!(!applies_live("channel.telegram.token"));
        assert!(applies_live("approvals.telegram_chat"));
        assert!(applies_live("schedule.nightly"));
        assert!(!applies_live("models.primary.cost_per_mtok.cache_write_1h"));
    }
}
