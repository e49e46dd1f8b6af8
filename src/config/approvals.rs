//! `[approvals]` (SPEC §18.1): which tool calls need a person's yes, and how long one waits.
//! Applies live on SIGHUP (`Config::with_live_parts_of`).

use super::keys::behavior::{
    APPROVALS_APPROVERS, APPROVALS_OVER_USD, APPROVALS_REQUIRE, APPROVALS_SYSTEM_ALLOW,
    APPROVALS_TELEGRAM_CHAT, APPROVALS_TIMEOUT,
};
use super::keys::codec::{List, Str};
use super::keys::{Fixed, Key};
use super::types::{ApprovalsConfig, Config};
use super::walker::Section;

/// At most this many globs in `require` or `system_allow`.
pub const MAX_GLOBS: usize = 256;

/// At most this many user ids in `approvers`.
pub const MAX_APPROVERS: usize = 256;

/// `[approvals]`.
pub fn approvals(root: &mut Section<'_>) -> ApprovalsConfig {
    let mut s = root.section("approvals");
    let require = globs(&mut s, &APPROVALS_REQUIRE);
    let system_allow = globs(&mut s, &APPROVALS_SYSTEM_ALLOW);
    let over_usd = s.read(&APPROVALS_OVER_USD);
    let timeout = s.read(&APPROVALS_TIMEOUT);
    let telegram_chat = s.read(&APPROVALS_TELEGRAM_CHAT);
    if telegram_chat == Some(0) {
        s.problem(
            "telegram_chat",
            "0 is not a Telegram chat id; use the numeric id of the chat (a user's id for a private chat, a negative id for a group)",
        );
    }
    let approvers = approvers(&mut s);
    ApprovalsConfig {
        require,
        over_usd,
        timeout,
        telegram_chat: telegram_chat.filter(|c| *c != 0),
        system_allow,
        approvers,
    }
}

/// `approvers`: Telegram user ids (positive numbers) who may decide any approval from any
/// chat.
fn approvers(s: &mut Section<'_>) -> Vec<i64> {
    let list = s.read(&APPROVALS_APPROVERS);
    if list.len() > MAX_APPROVERS {
        s.problem(
            "approvers",
            format!(
                "{} user ids, over the limit of {MAX_APPROVERS}; list the few people who decide approvals",
                list.len()
            ),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, id) in list.into_iter().enumerate() {
        if id > 0 {
            out.push(id);
        } else {
            s.problem(
                &format!("approvers[{i}]"),
                format!(
                    "{id} is not a Telegram user id: a user's id is a positive number (a negative id is a group chat); list the numeric ids of the people who may decide, e.g. approvers = [123456789]"
                ),
            );
        }
    }
    out
}

/// A list of tool-name globs: `*` and `?` over the characters of tool names.
fn globs(s: &mut Section<'_>, key: &Key<Config, List<Str>, Fixed<Vec<String>>>) -> Vec<String> {
    let list = s.read(key);
    let key = key.leaf();
    if list.len() > MAX_GLOBS {
        s.problem(
            key,
            format!(
                "{} globs, over the limit of {MAX_GLOBS}; use wider globs such as \"github__*\"",
                list.len()
            ),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, g) in list.into_iter().enumerate() {
        match glob_problem(&g) {
            Some(why) => s.problem(&format!("{key}[{i}]"), format!("{g:?}: {why}")),
            None => out.push(g),
        }
    }
    out
}

/// Why `g` is not a usable tool-name glob, if it is not.
fn glob_problem(g: &str) -> Option<String> {
    if g.is_empty() {
        return Some("an empty glob matches nothing; remove it".into());
    }
    if g.chars().count() > 128 {
        return Some("longer than 128 characters; tool names have at most 64".into());
    }
    if let Some(c) = g
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '?')))
    {
        return Some(format!(
            "{c:?} is not allowed: use tool-name characters (A-Z a-z 0-9 _ -) and the wildcards * and ?, e.g. \"exec\" or \"github__*\""
        ));
    }
    None
}

/// Whether `name` matches the glob `g` (`*`: any run of characters, `?`: one character).
pub fn glob_matches(g: &str, name: &str) -> bool {
    let (g, n): (Vec<char>, Vec<char>) = (g.chars().collect(), name.chars().collect());
    // Iterative wildcard match with one backtrack point: linear in practice, no recursion.
    let (mut gi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, ni));
            gi += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

impl ApprovalsConfig {
    /// Whether a call of `tool` needs a person's yes by `require`.
    pub fn requires(&self, tool: &str) -> bool {
        self.require.iter().any(|g| glob_matches(g, tool))
    }

    /// Whether the Telegram user `user_id` may decide any approval from any chat (`approvers`).
    pub fn is_approver(&self, user_id: i64) -> bool {
        self.approvers.contains(&user_id)
    }

    /// Whether a `system`-source message may run `tool` without a yes (`system_allow`).
    pub fn system_allows(&self, tool: &str) -> bool {
        self.system_allow.iter().any(|g| glob_matches(g, tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_tool_names() {
        for (g, name, want) in [
            ("exec", "exec", true),
            ("exec", "execs", false),
            ("github__*", "github__create_issue", true),
            ("github__*", "github_x", false),
            ("*", "anything", true),
            ("w?ite", "write", true),
            ("*__delete*", "fs__delete_file", true),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbc", false),
            ("", "", true),
        ] {
            assert_eq!(glob_matches(g, name), want, "{g} vs {name}");
        }
    }

    #[test]
    fn bad_globs_are_named() {
        assert!(glob_problem("").is_some());
        assert!(glob_problem("ex ec").unwrap().contains("not allowed"));
        assert!(glob_problem("[ab]").is_some());
        assert!(glob_problem("github__*").is_none());
    }
}
