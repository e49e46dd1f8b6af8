//! `[memory]` (and its sub-tables), `[paths]`, `[logging]`, `[retention]`, `[backup]` and
//! `[voice]`.

use std::time::Duration;

use super::agent::strings;
use super::codec::{Age, Bool, Int, List, Mib, Num, OneOf, Opt, Path, Str, TEXT, WORD};
use crate::config::types::VoiceReply;

/// Largest `max_audio_bytes`: OpenAI's transcription endpoint takes at most 25 MB, and the file
/// is held in memory while it is sent.
pub const MAX_AUDIO_BYTES_CEILING: i64 = 100 << 20;
/// Largest `max_tts_chars` (a request's text is held in memory and billed per character).
pub const MAX_TTS_CHARS_CEILING: i64 = 100_000;

/// `[voice] voice` when not set and `tts_model` is OpenAI-compatible (SPEC §19). ElevenLabs
/// has no default: its voices are ids from the user's voice library.
pub const DEFAULT_OPENAI_VOICE: &str = "alloy";

config_keys! {
    MEMORY = [
        MEMORY_ENABLED: "memory" "enabled", Bool = Bool,
            default(true), restart, memory.enabled,
            "`false`: no `memory.db`, no memory tools, no recall; `agentd index` and `agentd consolidate` refuse to run";
        SEARCH_TOP_K: "memory" "search_top_k", Int<u32> = Int::at_least(1),
            default(10), restart, memory.search_top_k,
            "note excerpts per `memory_search` (unless it asks for `k`) and per recall";
        INDEXER_INCLUDE: "memory" "indexer.include", List<Str> = List(TEXT),
            default(strings(&["MEMORY.md", "memory/*.md"])), restart, memory.indexer_include,
            "globs relative to the workspace (`**` matches directories); an absolute path, `..` or invalid glob syntax is a config error";
        CHUNK_CHARS: "memory" "indexer.chunk_chars", Int<usize> = Int::at_least(1),
            default(1600), restart, memory.chunk_chars,
            "largest chunk, in characters (a longer single line is one chunk)";
        OVERLAP_CHARS: "memory" "indexer.overlap_chars", Int<usize> = Int::at_least(0),
            default(320), restart, memory.overlap_chars,
            "trailing lines of a chunk repeated at the start of the next; must be below `chunk_chars`";
        RECALL_MAX_TOKENS: "memory" "recall.max_tokens", Int<u32> = Int::at_least(0),
            default(1500), restart, memory.recall_max_tokens,
            "budget of the recall block attached to each message (0 = off)";
        CONSOLIDATION_ENABLED: "memory" "consolidation.enabled", Bool = Bool,
            default(false), restart, memory.consolidation_enabled,
            "consolidate before each compaction and after a session reset. `agentd consolidate` and `job = \"consolidate\"` work either way";
        CONSOLIDATION_MIN_MESSAGES: "memory" "consolidation.min_messages", Int<u32> = Int::at_least(1),
            default(4), restart, memory.consolidation_min_messages,
            "new messages a session needs before it is consolidated";
        CONSOLIDATION_CONFIDENCE: "memory" "consolidation.confidence_threshold", Num = Num { min: 0.0, max: 1.0 },
            default(0.6), restart, memory.consolidation_confidence_threshold,
            "extracted facts below this confidence are dropped";
    ]
}

config_keys! {
    PATHS = [
        STATE_DIR: "paths" "state_dir", Path = Path,
            derived("`\"~/.agentd\"`"), restart, paths.state_dir,
            "everything the daemon writes (see README); relative to the config directory. `AGENTD_STATE_DIR`, from the environment or `.env`, wins";
    ]
}

config_keys! {
    LOGGING = [
        LOG_LEVEL: "logging" "level", Str = WORD,
            default("info".to_string()), restart, logging.level,
            "a level (`error` … `trace`) and `target=level` pairs, comma-separated, e.g. `\"info,agentd::llm=debug\"` (a target covers its submodules; span and field filters are refused). `AGENTD_LOG` wins. An invalid filter stops the start with exit 1";
        LOG_FILE: "logging" "file", Bool = Bool,
            default(true), restart, logging.file,
            "also write `<state_dir>/logs/agentd.<date>.log`";
        LOG_KEEP_FILES: "logging" "keep_files", Int<usize> = Int::at_least(1),
            default(7), restart, logging.keep_files,
            "daily log files kept";
        LOG_MAX_TOTAL: "logging" "max_total_mb", Mib = Mib(Int::at_least(1)),
            default(256 << 20), restart, logging.max_total_bytes,
            "the log files' total size at most: the oldest files are deleted first; when today's file alone reaches it, lines are dropped until the next day and their count is written then";
    ]
}

config_keys! {
    RETENTION = [
        INBOX_MAX_AGE: "retention" "inbox_max_age", Age = Age,
            default(Some(Duration::from_secs(30 * 86_400))), restart, retention.inbox_max_age,
            "files in `<state_dir>/inbox/` (downloads, voice notes, TTS output, `text_file`s) older than this are deleted";
        IDLE_SESSION_AFTER: "retention" "idle_session_after", Age = Age,
            default(None), restart, retention.idle_session_after,
            "a session with no activity for this long is archived as by `/reset` (after its running message, never under it); the next message starts a new session";
        ARCHIVE_MAX_AGE: "retention" "archive_max_age", Age = Age,
            default(None), restart, retention.archive_max_age,
            "archived sessions (`sessions/.archive/`) older than this are deleted for good";
    ]
}

config_keys! {
    BACKUP = [
        BACKUP_DIR: "backup" "dir", Opt<Path> = Opt(Path),
            derived("`<state_dir>/backups`"), restart, backup.dir,
            "where scheduled backups go (created 0700); relative to the config directory";
        BACKUP_EVERY: "backup" "every", Age = Age,
            default(None), restart, backup.every,
            "how often the daemon writes a backup of the state, workspace and config (`\"1d\"`, `\"12h\"`), off the message path; `\"0\"`: never";
        BACKUP_KEEP: "backup" "keep", Int<usize> = Int::at_least(1),
            default(7), restart, backup.keep,
            "scheduled backups kept in `dir`; the oldest beyond this are deleted";
    ]
}

config_keys! {
    VOICE = [
        STT_MODEL: "voice" "stt_model", Opt<Str> = Opt(WORD),
            default(None), restart, voice.stt_model,
            "a defined model on an OpenAI-compatible `/audio/transcriptions` endpoint; audio attachments are transcribed. Not set: the placeholder naming the saved file";
        TTS_MODEL: "voice" "tts_model", Opt<Str> = Opt(WORD),
            default(None), restart, voice.tts_model,
            "a defined model on an OpenAI-compatible `/audio/speech` endpoint answering OGG/Opus, or of a `type = \"elevenlabs\"` provider; enables the `tts` tool and spoken replies";
        REPLY: "voice" "reply", OneOf<VoiceReply> = OneOf(&[("off", VoiceReply::Off), ("mirror", VoiceReply::Mirror), ("always", VoiceReply::Always)]),
            default(VoiceReply::Off), restart, voice.reply,
            "`\"mirror\"`: a voice note is answered with text and a voice note; `\"always\"`: every Telegram reply is also spoken; other than `\"off\"` needs `tts_model`";
        ECHO_TRANSCRIPT: "voice" "echo_transcript", Bool = Bool,
            default(true), restart, voice.echo_transcript,
            "quote the transcript back in Telegram";
        VOICE_NAME: "voice" "voice", Str = WORD,
            derived("`\"alloy\"` for an OpenAI-compatible `tts_model`; none for ElevenLabs: a voice id is required"), restart, voice.voice,
            "the voice sent with speech requests (the `tts` tool may name another); for a `type = \"elevenlabs\"` `tts_model` a voice id from the provider's voice library, e.g. `\"JBFqnCBsd6RMkjVDRZzb\"`: `check-config` and start refuse such a model without one";
        MAX_AUDIO_BYTES: "voice" "max_audio_bytes", Int<u64> = Int::capped(1024, MAX_AUDIO_BYTES_CEILING, "; lower it (OpenAI accepts 25 MB)"),
            default(20 << 20), restart, voice.max_audio_bytes,
            "larger audio is not transcribed, larger speech answers are refused";
        MAX_AUDIO_SECONDS: "voice" "max_audio_seconds", Int<u64> = Int::at_least(1),
            default(600), restart, voice.max_audio_seconds,
            "audio longer than this (read from the file: OGG/Opus pages and packets, MP3 frames, WAV data) is not transcribed; audio whose length cannot be read from the file is never transcribed";
        MAX_TTS_CHARS: "voice" "max_tts_chars", Int<usize> = Int::capped(1, MAX_TTS_CHARS_CEILING, "; lower it (OpenAI accepts 4096)"),
            default(4096), restart, voice.max_tts_chars,
            "most characters the `tts` tool speaks (longer is refused; a spoken reply is cut at a sentence)";
    ]
}
