//! `[channel.telegram]`, `[matrix]`, `[fifo]` and `[http]`.

use std::time::Duration;

use super::codec::{Bool, Dur, Int, List, Map, OneOf, Origin, Path, Str, TEXT, Url, WORD};
use crate::config::types::TelegramFormat;

const MIB: u64 = 1024 * 1024;

config_keys! {
    TELEGRAM = [
        TG_ENABLED: "channel.telegram" "enabled", Bool = Bool,
            default(false), restart, telegram.enabled,
            "run the Telegram channel; `true` needs the token variable set (else a config error)";
        TG_TOKEN_ENV: "channel.telegram" "token_env", Str = WORD,
            default("AGENTD_TELEGRAM_TOKEN".to_string()), restart, telegram.token_env,
            "variable holding the bot token";
        TG_API_URL: "channel.telegram" "api_url", Url = Url { empty_ok: false },
            default("https://api.telegram.org".to_string()), restart, telegram.api_url,
            "Bot API server (any server that speaks the Bot API); must be http(s)";
        TG_ALLOW_FROM: "channel.telegram" "allow_from", List<Int<i64>> = List(Int::any()),
            default(Vec::new()), live, telegram.allow_from,
            "numeric user ids allowed to talk to the bot; empty = nobody. A rejected sender is logged with its id";
        TG_CONTACTS: "channel.telegram" "contacts", Map<Int<i64>> = Map(Int::any()),
            default(Default::default()), live, telegram.contacts,
            "`{ Name = user id }`: a contact's session key in a private chat is the name (else `tg:<id>`; a group is its own session `tg:group:<chat id>`), and FIFO `user` messages whose `--from` is a contact name are answered in that chat too. `[[schedule]] to` must name one";
        TG_TEXT_CHUNK_LIMIT: "channel.telegram" "text_chunk_limit", Int<usize> = Int::capped(1, 4096, "; Telegram accepts at most 4096 characters per message"),
            default(4096), restart, telegram.text_chunk_limit,
            "replies are split into messages of at most this many UTF-16 units (values below 16 act as 16)";
        TG_POLL_TIMEOUT: "channel.telegram" "poll_timeout_seconds", Dur = Dur::secs(0),
            default(Duration::from_secs(30)), restart, telegram.poll_timeout,
            "long-poll timeout; the HTTP client waits 15 s longer, and a poll unanswered 20 s past it is restarted";
        TG_MAX_DOWNLOAD_BYTES: "channel.telegram" "max_download_bytes", Int<u64> = Int::at_least(1),
            default(20 * MIB), restart, telegram.max_download_bytes,
            "size cap for downloads into `inbox/` (the default is 20 MiB)";
        TG_FORMAT: "channel.telegram" "format", OneOf<TelegramFormat> = OneOf(&[("html", TelegramFormat::Html), ("plain", TelegramFormat::Plain)]),
            default(TelegramFormat::Html), restart, telegram.format,
            "`\"html\"`: Markdown rendered as Telegram HTML, a part Telegram rejects is resent as its raw text; `\"plain\"`: the reply text is sent as is";
    ]
}

config_keys! {
    MATRIX = [
        MX_HOMESERVER: "matrix" "homeserver", Url = Url { empty_ok: true },
            default(String::new()), restart, matrix.homeserver,
            "the homeserver's client API URL (`https://matrix.example.org`); setting it turns the Matrix channel on (SPEC §21, docs/matrix.md); empty = off";
        MX_USER_ID: "matrix" "user_id", Str = TEXT,
            default(String::new()), restart, matrix.user_id,
            "the bot's user id, `@name:server`; required";
        MX_DEVICE_ID: "matrix" "device_id", Str = TEXT,
            default(String::new()), restart, matrix.device_id,
            "the bot's device; empty = the device of the first login, kept in `<state_dir>/matrix/`";
        MX_TOKEN_ENV: "matrix" "token_env", Str = WORD,
            default("AGENTD_MATRIX_TOKEN".to_string()), restart, matrix.token_env,
            "variable holding the bot's access token (one of it and `password_env` must be set)";
        MX_PASSWORD_ENV: "matrix" "password_env", Str = WORD,
            default("AGENTD_MATRIX_PASSWORD".to_string()), restart, matrix.password_env,
            "variable holding the bot's password, used when no token is set: the first login's device and token are kept in `<state_dir>/matrix/` (0600), so a restart does not create a device";
        MX_RECOVERY_KEY_ENV: "matrix" "recovery_key_env", Str = WORD,
            default("AGENTD_MATRIX_RECOVERY_KEY".to_string()), restart, matrix.recovery_key_env,
            "variable holding the account's recovery key: when set, the device recovers the cross-signing and backup keys at start and so is verified (docs/matrix.md)";
        MX_ALLOW_FROM: "matrix" "allow_from", List<Str> = List(WORD),
            default(Vec::new()), live, matrix.allow_from,
            "user ids allowed to talk to the bot and to invite it (`@alice:example.org`; `@alice:*` allows any server); empty = nobody. Invites from others are declined and logged";
        MX_ROOMS: "matrix" "rooms", List<Str> = List(WORD),
            default(Vec::new()), live, matrix.rooms,
            "room ids (`!abc:example.org`) the bot answers in; empty = any room an allowed user invited it to";
        MX_CONTACTS: "matrix" "contacts", Map<Str> = Map(WORD),
            default(Default::default()), live, matrix.contacts,
            "`{ Name = \"@user:server\" or \"!room:server\" }`: where the `message` tool and scheduled messages reach a contact (a user id: the direct chat with that user)";
        MX_ENCRYPTION: "matrix" "encryption", Bool = Bool,
            default(true), restart, matrix.encryption,
            "end-to-end encryption: encrypted rooms are read and answered encrypted; `false` ignores encrypted rooms";
        MX_TEXT_CHUNK_LIMIT: "matrix" "text_chunk_limit", Int<usize> = Int::capped(16, 16_000, "; a Matrix event holds at most 64 KiB"),
            default(8_000), restart, matrix.text_chunk_limit,
            "replies are split into messages of at most this many characters";
        MX_MAX_DOWNLOAD_BYTES: "matrix" "max_download_bytes", Int<u64> = Int::capped(1, 50 * 1024 * 1024, "; files are taken up to 50 MiB"),
            default(50 * MIB), restart, matrix.max_download_bytes,
            "size cap for images, files and audio taken into `inbox/` (by the declared and the actual size)";
        MX_MAX_ROOM_MEMBERS: "matrix" "max_room_members", Int<usize> = Int::at_least(2),
            default(100), live, matrix.max_room_members,
            "the bot leaves (and never answers in) a room with more joined members than this: every member's devices would get the keys of its messages, and everyone there could talk to the agent";
    ]
}

config_keys! {
    FIFO = [
        FIFO_ENABLED: "fifo" "enabled", Bool = Bool,
            default(true), restart, fifo.enabled,
            "create and read the control FIFO";
        FIFO_PATH: "fifo" "path", Path = Path,
            derived("`<state_dir>/control.pipe`"), restart, fifo.path,
            "FIFO path; relative to the config directory";
        FIFO_MAX_LINE_BYTES: "fifo" "max_line_bytes", Int<usize> = Int::at_least(1),
            default(4096), restart, fifo.max_line_bytes,
            "longer lines are skipped; keep it at 4096 (`PIPE_BUF`), since longer writes are not atomic";
    ]
}

config_keys! {
    MCP_SERVE = [
        MCP_SERVE_ALLOW_APPROVALS: "mcp_server" "allow_approvals", Bool = Bool,
            default(false), restart, mcp_server.allow_approvals,
            "offer the `approvals` and `decide` tools to MCP clients (`agentd mcp` and `/mcp`, docs/mcp-server.md). Off by default: a client that approves the calls of its own messages defeats approvals";
    ]
}

config_keys! {
    HTTP = [
        HTTP_ENABLED: "http" "enabled", Bool = Bool,
            default(false), restart, http.enabled,
            "serve the HTTP API";
        HTTP_HOST: "http" "host", Str = WORD,
            default("127.0.0.1".to_string()), restart, http.host,
            "bind address";
        HTTP_PORT: "http" "port", Int<u16> = Int::at_least(1),
            default(8100), restart, http.port,
            "bind port; a port in use stops the start with exit 1";
        HTTP_TOKEN_ENV: "http" "token_env", Str = WORD,
            default("AGENTD_HTTP_TOKEN".to_string()), restart, http.token_env,
            "bearer token variable; unset = every endpoint but `GET /api/v1/status` answers 503";
        HTTP_MAX_BODY_BYTES: "http" "max_body_bytes", Int<usize> = Int::at_least(1),
            default(10 * MIB as usize), restart, http.max_body_bytes,
            "request body limit (413 above it; the default is 10 MiB); also the size cap of a FIFO `text_file` (a larger file is refused and logged), so a message has one bound however it arrives";
        HTTP_MAX_CONNECTIONS: "http" "max_connections", Int<usize> = Int::at_least(1),
            default(256), restart, http.max_connections,
            "HTTP connections open at once, and never more than a quarter of the daemon's file-descriptor limit (`RLIMIT_NOFILE`, which the daemon raises to its hard limit at start), so clients can never starve the trail, the FIFO or the databases. A connection beyond the cap is answered `503` and closed. Every connection must send its request head within 5 s, also between keep-alive requests";
        HTTP_RATE_LIMIT: "http" "rate_limit", Int<u32> = Int::at_least(1),
            default(30), restart, http.rate_limit,
            "POSTs per window per client IP (IPv6: per /64)";
        HTTP_STATUS_RATE_LIMIT: "http" "status_rate_limit", Int<u32> = Int::at_least(1),
            default(60), restart, http.status_rate_limit,
            "GETs (including `/api/v1/status` and `/metrics`) per window per client IP";
        HTTP_RATE_WINDOW: "http" "rate_window_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(60)), restart, http.rate_window,
            "rate-limit window";
        HTTP_CALLBACK_URL: "http" "callback_url", Url = Url { empty_ok: true },
            default(String::new()), restart, http.callback_url,
            "webhook POSTed after every processed message (whether or not `enabled` is true: it reports messages from every source); must be http(s); empty = off";
        HTTP_CALLBACK_TOKEN_ENV: "http" "callback_token_env", Str = TEXT,
            default(String::new()), restart, http.callback_token_env,
            "webhook bearer token variable; if set together with `callback_url`, the variable must be set";
        HTTP_CALLBACK_TIMEOUT: "http" "callback_timeout_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(10)), restart, http.callback_timeout,
            "webhook timeout, per attempt";
        HTTP_CORS_ORIGINS: "http" "cors_origins", List<Origin> = List(Origin),
            default(Vec::new()), restart, http.cors_origins,
            "browser origins (`scheme://host[:port]`, exactly as the browser sends `Origin`) whose pages may call the API: they get CORS answers (any request header, `x-request-id` readable) and still need the token. Empty = no CORS, so browsers keep other sites' pages out. `*` is refused: list each origin";
        HTTP_CONSOLE: "http" "console", Bool = Bool,
            default(true), restart, http.console,
            "serve the web console at `/console/` on the API listener (SPEC §22); login with the API token";
        HTTP_CONSOLE_SECURE_COOKIE: "http" "console_secure_cookie", Bool = Bool,
            default(false), restart, http.console_secure_cookie,
            "mark the console's session cookie `Secure` on every answer (set it when a TLS proxy sits in front); it is marked anyway when a request carries `X-Forwarded-Proto: https`";
    ]
}
