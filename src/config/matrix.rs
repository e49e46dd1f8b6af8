//! `[matrix]` (SPEC §21): the Matrix channel, on when `homeserver` is set. The secrets come
//! from the environment only (`token_env`, `password_env`, `recovery_key_env`).

use std::collections::BTreeMap;

use secrecy::SecretString;

use super::channels::secret;
use super::keys::channels as kc;
use super::walker::Section;

/// `[matrix]` (SPEC §21): on when `homeserver` is set.
#[derive(Debug, Clone, Default)]
pub struct MatrixConfig {
    pub enabled: bool,
    /// The client API URL, without a trailing `/`.
    pub homeserver: String,
    pub user_id: String,
    /// Empty: the device of the first login, kept in `state_dir/matrix/`.
    pub device_id: String,
    pub token_env: String,
    pub token: Option<SecretString>,
    pub password_env: String,
    pub password: Option<SecretString>,
    pub recovery_key_env: String,
    pub recovery_key: Option<SecretString>,
    /// User ids (`@name:server`, `*` allowed as the whole server part). Empty = nobody.
    pub allow_from: Vec<String>,
    /// Room ids the bot answers in; empty = any room it joined.
    pub rooms: Vec<String>,
    /// Contact name → user id or room id.
    pub contacts: BTreeMap<String, String>,
    pub encryption: bool,
    pub text_chunk_limit: usize,
    pub max_download_bytes: u64,
    /// Rooms with more joined members are left, never answered in.
    pub max_room_members: usize,
}

/// `[matrix]`; without a homeserver: off.
pub fn matrix(root: &mut Section<'_>) -> MatrixConfig {
    let mut s = root.section("matrix");
    let homeserver = s.read(&kc::MX_HOMESERVER);
    let enabled = !homeserver.trim().is_empty();
    let user_id = s.read(&kc::MX_USER_ID);
    let token_env = s.read(&kc::MX_TOKEN_ENV);
    let password_env = s.read(&kc::MX_PASSWORD_ENV);
    let recovery_key_env = s.read(&kc::MX_RECOVERY_KEY_ENV);
    let cfg = MatrixConfig {
        enabled,
        homeserver: homeserver.trim_end_matches('/').to_string(),
        device_id: s.read(&kc::MX_DEVICE_ID),
        token: secret(&s, "token_env", &token_env),
        password: secret(&s, "password_env", &password_env),
        recovery_key: secret(&s, "recovery_key_env", &recovery_key_env),
        token_env,
        password_env,
        recovery_key_env,
        allow_from: s.read(&kc::MX_ALLOW_FROM),
        rooms: s.read(&kc::MX_ROOMS),
        contacts: s.read(&kc::MX_CONTACTS),
        encryption: s.read(&kc::MX_ENCRYPTION),
        text_chunk_limit: s.read(&kc::MX_TEXT_CHUNK_LIMIT),
        max_download_bytes: s.read(&kc::MX_MAX_DOWNLOAD_BYTES),
        max_room_members: s.read(&kc::MX_MAX_ROOM_MEMBERS),
        user_id,
    };
    // A section naming the bot without a homeserver is a mistake, not "off".
    if enabled || !cfg.user_id.is_empty() {
        check(&s, &cfg);
    }
    cfg
}

/// The checks that span keys or need the Matrix id syntax.
fn check(s: &Section<'_>, cfg: &MatrixConfig) {
    if cfg.homeserver.is_empty() {
        s.problem(
            "homeserver",
            "required; add homeserver = \"https://matrix.example.org\" to [matrix]",
        );
    }
    if cfg.user_id.is_empty() {
        s.problem(
            "user_id",
            "required; add user_id = \"@agent:example.org\" (the bot's account) to [matrix]",
        );
    } else if !is_id(&cfg.user_id, '@', false) {
        s.problem(
            "user_id",
            format!(
                "{:?} is not a Matrix user id; write it as \"@name:server\"",
                cfg.user_id
            ),
        );
    }
    if cfg.token.is_none() && cfg.password.is_none() {
        s.problem(
            "token_env",
            format!(
                "neither {} nor {} is set but [matrix] homeserver is; put the bot's access token (or its password) in the .env beside the config or the environment, or remove [matrix]",
                cfg.token_env, cfg.password_env
            ),
        );
    }
    for (i, u) in cfg.allow_from.iter().enumerate() {
        if !is_id(u, '@', true) {
            s.problem(
                &format!("allow_from[{i}]"),
                format!(
                    "{u:?} is not a Matrix user id; write \"@name:server\" (\"@name:*\" for any server)"
                ),
            );
        }
    }
    for (i, r) in cfg.rooms.iter().enumerate() {
        if !is_room_id(r) {
            s.problem(
                &format!("rooms[{i}]"),
                format!(
                    "{r:?} is not a room id; write \"!opaque:server\" (Room settings → Advanced)"
                ),
            );
        }
    }
    for (name, to) in &cfg.contacts {
        if !is_id(to, '@', false) && !is_room_id(to) {
            s.problem(
                &format!("contacts.{name}"),
                format!("{to:?} is neither a user id (\"@name:server\") nor a room id (\"!opaque:server\")"),
            );
        }
    }
}

/// Whether `s` is a room id: `!opaque:server`, or `!opaque` (room version 12).
pub fn is_room_id(s: &str) -> bool {
    is_id(s, '!', false)
        || (s.len() > 1
            && s.starts_with('!')
            && !s.contains([':', '*'])
            && !s.chars().any(char::is_whitespace))
}

/// Whether `s` is `<sigil>local:server` (a room or user id); with `glob`, the server part may
/// be `*`.
pub fn is_id(s: &str, sigil: char, glob: bool) -> bool {
    let Some(rest) = s.strip_prefix(sigil) else {
        return false;
    };
    let Some((local, server)) = rest.split_once(':') else {
        return false;
    };
    let bad = |c: char| c.is_whitespace() || c.is_control();
    !local.is_empty()
        && !server.is_empty()
        && !s.chars().any(bad)
        && s.len() <= 255
        && !local.contains('*')
        && (server == "*" && glob || !server.contains('*'))
}

#[cfg(test)]
mod tests {
    use super::is_id;
    use crate::config::tests::{MINIMAL, minimal_with_key};
    use secrecy::ExposeSecret;

    #[test]
    fn the_section_turns_the_channel_on_and_is_validated() {
        let f = minimal_with_key();
        let c = f.ok();
        assert!(!c.matrix.enabled, "absent = off");
        let mut f = minimal_with_key();
        f.write(
            "config/agentd.toml",
            &format!(
                "{MINIMAL}\n[matrix]\nhomeserver = \"http://127.0.0.1:8008/\"\nuser_id = \"@bot:localhost\"\nallow_from = [\"@alice:*\"]\ncontacts = {{ Alice = \"@alice:localhost\" }}\n"
            ),
        );
        f.set("AGENTD_MATRIX_TOKEN", "syt_SECRET");
        let c = f.ok();
        assert!(c.matrix.enabled && c.matrix.encryption);
        assert_eq!(c.matrix.homeserver, "http://127.0.0.1:8008");
        assert_eq!(
            c.matrix.token.as_ref().unwrap().expose_secret(),
            "syt_SECRET"
        );
        assert_eq!(c.matrix.allow_from, ["@alice:*"]);
        assert!(c.secrets_to_scrub().iter().any(|s| s == "syt_SECRET"));
        assert!(!crate::config::render_effective(&c).contains("syt_SECRET"));

        f.write(
            "config/agentd.toml",
            &format!(
                "{MINIMAL}\n[matrix]\nuser_id = \"bot\"\nallow_from = [\"@*:x\"]\nrooms = [\"#alias:x\"]\nmax_room_members = 1\n"
            ),
        );
        f.env.remove("AGENTD_MATRIX_TOKEN");
        let problems = f.problems();
        for expected in [
            "matrix.homeserver: required",
            "matrix.user_id: \"bot\" is not a Matrix user id",
            "matrix.token_env: neither AGENTD_MATRIX_TOKEN nor AGENTD_MATRIX_PASSWORD is set",
            "matrix.allow_from[0]: \"@*:x\" is not a Matrix user id",
            "matrix.rooms[0]: \"#alias:x\" is not a room id",
            "matrix.max_room_members: expected an integer ≥ 2, got 1",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{expected} missing in {problems:#?}"
            );
        }
    }

    #[test]
    fn ids_and_server_globs() {
        assert!(is_id("@alice:example.org", '@', false));
        assert!(is_id("@alice:localhost:8448", '@', false));
        assert!(is_id("!abc:example.org", '!', false));
        assert!(is_id("@alice:*", '@', true));
        assert!(!is_id("@alice:*", '@', false));
        assert!(!is_id("@*:example.org", '@', true));
        assert!(!is_id("alice", '@', true));
        assert!(!is_id("@alice", '@', true));
        assert!(!is_id("@al ice:x", '@', true));
        assert!(!is_id("!abc:example.org", '@', true));
        assert!(super::is_room_id("!v12opaque") && super::is_room_id("!a:x"));
        assert!(!super::is_room_id("#alias:x") && !super::is_room_id("!"));
    }
}
