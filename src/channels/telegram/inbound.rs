//! Inbound Telegram messages as agentd sees them (SPEC §10.3): pure conversion of a teloxide
//! `Update` / `Message` into [`TgInbound`], the `allow_from` filter and contact names. Nothing
//! here does I/O.

use teloxide::types::{Chat, Message, Update, UpdateKind};

use crate::channels::commands::{self, ChatCommand};
use crate::config::TelegramConfig;

/// One message from a Telegram user, ready for intake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgInbound {
    /// The update's id; the poller confirms `update_id + 1` after intake.
    pub update_id: i64,
    /// Where replies go.
    pub chat_id: i64,
    /// The sender; what `allow_from` and `contacts` match.
    pub user_id: i64,
    /// The message's id in its chat (for reactions and replies).
    pub message_id: i32,
    /// The sender's name: the contact name whose id is `user_id`, else `tg:<user id>`.
    pub from_name: String,
    /// The session key (SPEC §16.9): in a private chat the sender's name (`from_name`); a
    /// group chat is its own session, `tg:group:<chat id>`, so replies never cross chats.
    pub session_key: String,
    /// The text, or the media caption; empty when there is neither.
    pub text: String,
    /// An attachment to download (photos: the largest size).
    pub media: Option<TgMedia>,
    /// `/reset`, `/stop`, `/status` (also `/reset@bot_name`, arguments ignored), `/model`,
    /// `/skills`, `/skill` (with their arguments): `channels::commands`.
    pub is_command: Option<ChatCommand>,
}

/// An attachment of an inbound message. Download it with `TelegramClient::download`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgMedia {
    pub kind: TgMediaKind,
    pub file_id: String,
    /// The sender's file name (documents and some audio files).
    pub file_name: Option<String>,
    /// MIME type as reported by Telegram (photos: `image/jpeg`).
    pub mime: Option<String>,
    /// Size in bytes, when Telegram reports it.
    pub size: Option<u64>,
}

/// Kinds of attachment agentd accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TgMediaKind {
    Photo,
    Voice,
    Audio,
    Document,
}

/// Whether `user_id` may talk to the bot: listed in `allow_from` (empty = nobody).
pub fn allowed(user_id: i64, cfg: &TelegramConfig) -> bool {
    cfg.allow_from.contains(&user_id)
}

/// The session key of `user_id`: the first contact name (in name order) mapped to it, else
/// `tg:<user id>`.
pub fn contact_name(user_id: i64, cfg: &TelegramConfig) -> String {
    cfg.contacts
        .iter()
        .find(|(_, id)| **id == user_id)
        .map_or_else(|| format!("tg:{user_id}"), |(name, _)| name.clone())
}

/// The session key of a group (or supergroup) chat.
pub fn group_key(chat_id: i64) -> String {
    format!("tg:group:{chat_id}")
}

/// The session of `chat` for a message or button press of `user_id` (SPEC §5.6, §16.9): the
/// one rule for a Telegram chat's session. A private chat is its person's (the contact name,
/// else `tg:<user id>`); a group is its own session, so replies never cross chats.
pub fn session_key(chat: &Chat, user_id: i64, cfg: &TelegramConfig) -> String {
    match chat.is_private() {
        true => contact_name(user_id, cfg),
        false => group_key(chat.id.0),
    }
}

/// The bot's own user id: the number before the colon of a bot token.
pub fn bot_id_from_token(token: &str) -> Option<i64> {
    token.split_once(':')?.0.parse().ok()
}

/// The data prefix of an approval button (`ap:<id>:a|s|d`).
pub const APPROVAL_BUTTON: &str = "ap:";

/// An approval button's data `ap:<id>:a|s|d` → the approval id and `a` (approve), `s`
/// (always in this session) or `d` (deny).
pub fn approval_button(data: &str) -> Option<(&str, char)> {
    let rest = data.strip_prefix(APPROVAL_BUTTON)?;
    let (id, what) = rest.rsplit_once(':')?;
    let what = match what {
        "a" => 'a',
        "s" => 's',
        "d" => 'd',
        _ => return None,
    };
    (!id.is_empty()).then_some((id, what))
}

/// The inbound message carried by `update`, or `None` for anything agentd ignores: updates
/// other than `message`, messages without a user sender, messages from bots (including this
/// one, `bot_id`), and messages with neither text, caption nor a supported attachment.
/// `allow_from` is NOT checked here (the poller logs rejected senders).
pub fn from_update(
    update: &Update,
    bot_id: Option<i64>,
    cfg: &TelegramConfig,
) -> Option<TgInbound> {
    match &update.kind {
        UpdateKind::Message(msg) => from_message(i64::from(update.id.0), msg, bot_id, cfg),
        _ => None,
    }
}

/// A press of an inline button (`callback_query`) under a message of the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgCallback {
    pub update_id: i64,
    /// For `answerCallbackQuery`.
    pub query_id: String,
    pub user_id: i64,
    /// The chat of the message the button is under.
    pub chat_id: i64,
    /// That chat's session key, as for a message ([`TgInbound::session_key`]).
    pub session_key: String,
    /// The button's data (Telegram allows 1-64 bytes).
    pub data: String,
}

/// Longest callback data Telegram sends (and agentd accepts).
pub const MAX_CALLBACK_DATA: usize = 64;

/// The button press carried by `update`, or `None` for anything else, a press by a bot, one
/// without data or with more than [`MAX_CALLBACK_DATA`] bytes, or one whose message is not
/// known. `allow_from` is NOT checked here.
pub fn callback_from_update(
    update: &Update,
    bot_id: Option<i64>,
    cfg: &TelegramConfig,
) -> Option<TgCallback> {
    let UpdateKind::CallbackQuery(q) = &update.kind else {
        return None;
    };
    let user_id = i64::try_from(q.from.id.0).ok()?;
    if q.from.is_bot || Some(user_id) == bot_id {
        return None;
    }
    let data = q
        .data
        .clone()
        .filter(|d| (1..=MAX_CALLBACK_DATA).contains(&d.len()))?;
    let chat = q.message.as_ref()?.chat();
    let session_key = session_key(chat, user_id, cfg);
    Some(TgCallback {
        update_id: i64::from(update.id.0),
        query_id: q.id.0.clone(),
        user_id,
        chat_id: chat.id.0,
        session_key,
        data,
    })
}

/// See [`from_update`].
pub fn from_message(
    update_id: i64,
    msg: &Message,
    bot_id: Option<i64>,
    cfg: &TelegramConfig,
) -> Option<TgInbound> {
    let from = msg.from.as_ref()?;
    let user_id = i64::try_from(from.id.0).ok()?;
    if from.is_bot || Some(user_id) == bot_id {
        return None;
    }
    let text = msg
        .text()
        .or_else(|| msg.caption())
        .unwrap_or("")
        .to_string();
    let media = media_of(msg);
    if text.trim().is_empty() && media.is_none() {
        return None;
    }
    let is_command = msg.text().and_then(commands::parse);
    let from_name = contact_name(user_id, cfg);
    let session_key = session_key(&msg.chat, user_id, cfg);
    Some(TgInbound {
        update_id,
        chat_id: msg.chat.id.0,
        user_id,
        message_id: msg.id.0,
        from_name,
        session_key,
        text,
        media,
        is_command,
    })
}

/// A file size from teloxide, where a missing size is `u32::MAX`.
fn known_size(size: u32) -> Option<u64> {
    (size != u32::MAX).then_some(u64::from(size))
}

fn media_of(msg: &Message) -> Option<TgMedia> {
    if let Some(sizes) = msg.photo() {
        let best = sizes
            .iter()
            .max_by_key(|p| (u64::from(p.width) * u64::from(p.height), p.file.size))?;
        return Some(TgMedia {
            kind: TgMediaKind::Photo,
            file_id: best.file.id.0.clone(),
            file_name: None,
            mime: Some("image/jpeg".into()),
            size: known_size(best.file.size),
        });
    }
    if let Some(v) = msg.voice() {
        return Some(TgMedia {
            kind: TgMediaKind::Voice,
            file_id: v.file.id.0.clone(),
            file_name: None,
            mime: v.mime_type.as_ref().map(ToString::to_string),
            size: known_size(v.file.size),
        });
    }
    if let Some(a) = msg.audio() {
        return Some(TgMedia {
            kind: TgMediaKind::Audio,
            file_id: a.file.id.0.clone(),
            file_name: a.file_name.clone(),
            mime: a.mime_type.as_ref().map(ToString::to_string),
            size: known_size(a.file.size),
        });
    }
    if let Some(d) = msg.document() {
        return Some(TgMedia {
            kind: TgMediaKind::Document,
            file_id: d.file.id.0.clone(),
            file_name: d.file_name.clone(),
            mime: d.mime_type.as_ref().map(ToString::to_string),
            size: known_size(d.file.size),
        });
    }
    None
}

#[cfg(test)]
mod callback_tests {
    use super::*;

    #[test]
    fn callback_queries_and_button_data() {
        let update: Update = serde_json::from_str(
            r#"{"update_id": 9, "callback_query": {"id": "cb1", "chat_instance": "x",
                "from": {"id": 42, "is_bot": false, "first_name": "A"},
                "message": {"message_id": 5, "date": 0,
                    "chat": {"id": 42, "type": "private", "first_name": "A"},
                    "from": {"id": 1, "is_bot": true, "first_name": "bot"}, "text": "?"},
                "data": "ap:ap-abc:s"}}"#,
        )
        .unwrap();
        let cb = callback_from_update(&update, None, &super::tests::cfg()).unwrap();
        assert_eq!((cb.update_id, cb.user_id), (9, 42));
        assert_eq!(cb.query_id, "cb1");
        assert_eq!(approval_button(&cb.data), Some(("ap-abc", 's')));
        assert_eq!(approval_button("ap:ap-abc:x"), None);
        assert_eq!(approval_button("ap::a"), None);
        assert_eq!(approval_button("other"), None);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::config::TelegramFormat;

    pub(super) fn cfg() -> TelegramConfig {
        TelegramConfig {
            enabled: true,
            token_env: "AGENTD_TELEGRAM_TOKEN".into(),
            token: None,
            api_url: "https://api.telegram.org".into(),
            allow_from: vec![42, 7],
            contacts: BTreeMap::from([("Alice".to_string(), 42), ("Zed".to_string(), 42)]),
            text_chunk_limit: 4096,
            poll_timeout: Duration::from_secs(30),
            max_download_bytes: 20 << 20,
            format: TelegramFormat::Html,
        }
    }

    fn message(from: Value, extra: Value) -> Message {
        let mut m = json!({
            "message_id": 17,
            "from": from,
            "chat": {"id": 42, "type": "private", "first_name": "A"},
            "date": 1_700_000_000,
        });
        if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        serde_json::from_value(m).expect("valid Message JSON")
    }

    fn user(id: i64) -> Value {
        json!({"id": id, "is_bot": false, "first_name": "A"})
    }

    fn update(kind: &str, payload: Value) -> Update {
        let mut u = serde_json::Map::new();
        u.insert("update_id".into(), json!(900));
        u.insert(kind.into(), payload);
        // From text, as teloxide parses it: `UpdateKind` needs borrowed keys.
        serde_json::from_str(&Value::Object(u).to_string()).expect("valid Update")
    }

    /// A button press becomes a `TgCallback` for the chat's session; a bot's press, one
    /// without data or with data over 64 bytes is none (SPEC §18.2).
    #[test]
    fn button_presses_become_callbacks() {
        let press = |from: Value, data: Value, chat: i64| {
            update(
                "callback_query",
                json!({"id": "q7", "from": from, "chat_instance": "c", "data": data,
                       "message": {"message_id": 3, "date": 0, "text": "pick",
                                   "chat": {"id": chat, "type": "private", "first_name": "A"}}}),
            )
        };
        let got = callback_from_update(&press(user(42), json!("model:cheap"), 42), None, &cfg())
            .expect("a press");
        assert_eq!(
            (
                got.query_id.as_str(),
                got.user_id,
                got.chat_id,
                got.data.as_str()
            ),
            ("q7", 42, 42, "model:cheap")
        );
        assert_eq!(got.session_key, contact_name(42, &cfg()));
        let bot = json!({"id": 42, "is_bot": true, "first_name": "B"});
        assert!(callback_from_update(&press(bot, json!("model:x"), 42), None, &cfg()).is_none());
        let long = json!("m".repeat(MAX_CALLBACK_DATA + 1));
        assert!(callback_from_update(&press(user(42), long, 42), None, &cfg()).is_none());
        let msg = update(
            "message",
            serde_json::to_value(message(user(42), json!({"text": "hi"}))).unwrap(),
        );
        assert!(callback_from_update(&msg, None, &cfg()).is_none());
    }

    #[test]
    fn text_message_becomes_inbound_with_contact_name() {
        let m = message(user(42), json!({"text": "hello"}));
        let got = from_message(5, &m, Some(999), &cfg()).expect("accepted");
        assert_eq!(
            got,
            TgInbound {
                update_id: 5,
                chat_id: 42,
                user_id: 42,
                message_id: 17,
                from_name: "Alice".into(),
                session_key: "Alice".into(),
                text: "hello".into(),
                media: None,
                is_command: None,
            }
        );
    }

    /// SPEC §16.9: a group chat is its own session; the sender keeps their contact name.
    #[test]
    fn group_message_has_the_group_session_key() {
        for chat in [
            json!({"id": -4242, "type": "group", "title": "G"}),
            json!({"id": -1_001_234_567_890_i64, "type": "supergroup", "title": "S"}),
        ] {
            let id = chat["id"].as_i64().unwrap();
            let m = message(user(42), json!({"text": "hello all", "chat": chat}));
            let got = from_message(5, &m, None, &cfg()).expect("accepted");
            assert_eq!(got.chat_id, id);
            assert_eq!(got.from_name, "Alice");
            assert_eq!(got.session_key, format!("tg:group:{id}"));
        }
        let private = message(user(555), json!({"text": "hi"}));
        assert_eq!(
            from_message(1, &private, None, &cfg()).unwrap().session_key,
            "tg:555"
        );
    }

    #[test]
    fn unknown_sender_is_named_by_id() {
        let m = message(user(555), json!({"text": "hi"}));
        assert_eq!(
            from_message(1, &m, None, &cfg()).unwrap().from_name,
            "tg:555"
        );
        assert_eq!(contact_name(555, &cfg()), "tg:555");
    }

    #[test]
    fn allow_from_is_exact_and_empty_means_nobody() {
        assert!(allowed(42, &cfg()));
        assert!(!allowed(43, &cfg()));
        let mut c = cfg();
        c.allow_from.clear();
        assert!(!allowed(42, &c));
    }

    #[test]
    fn own_and_other_bot_messages_are_ignored() {
        let own = message(
            json!({"id": 999, "is_bot": true, "first_name": "Me", "username": "me_bot"}),
            json!({"text": "echo"}),
        );
        assert!(from_message(1, &own, Some(999), &cfg()).is_none());
        let other = message(
            json!({"id": 5, "is_bot": true, "first_name": "B", "username": "b_bot"}),
            json!({"text": "x"}),
        );
        assert!(from_message(1, &other, Some(999), &cfg()).is_none());
        // Even if is_bot were missing, our own id is recognised.
        let spoof = message(user(999), json!({"text": "x"}));
        assert!(from_message(1, &spoof, Some(999), &cfg()).is_none());
    }

    #[test]
    fn non_message_updates_are_ignored() {
        let edited = update(
            "edited_message",
            json!({"message_id": 1, "from": user(42), "date": 1, "edit_date": 2,
                   "chat": {"id": 42, "type": "private", "first_name": "A"}, "text": "x"}),
        );
        assert!(from_update(&edited, None, &cfg()).is_none());
        let msg = update(
            "message",
            json!({"message_id": 1, "from": user(42), "date": 1,
                   "chat": {"id": 42, "type": "private", "first_name": "A"}, "text": "x"}),
        );
        let got = from_update(&msg, None, &cfg()).expect("message update accepted");
        assert_eq!(got.update_id, 900);
    }

    #[test]
    fn photo_takes_largest_size_and_caption() {
        let m = message(
            user(42),
            json!({"caption": "look", "photo": [
                {"file_id": "small", "file_unique_id": "s", "width": 90, "height": 60, "file_size": 10},
                {"file_id": "big", "file_unique_id": "b", "width": 1280, "height": 960, "file_size": 5000},
                {"file_id": "mid", "file_unique_id": "m", "width": 320, "height": 240, "file_size": 100},
            ]}),
        );
        let got = from_message(1, &m, None, &cfg()).unwrap();
        assert_eq!(got.text, "look");
        let media = got.media.unwrap();
        assert_eq!(media.kind, TgMediaKind::Photo);
        assert_eq!(media.file_id, "big");
        assert_eq!(media.size, Some(5000));
    }

    #[test]
    fn voice_audio_and_document_are_recognised() {
        let v = message(
            user(42),
            json!({"voice": {"file_id": "v1", "file_unique_id": "u", "duration": 3,
                              "mime_type": "audio/ogg", "file_size": 1234}}),
        );
        let got = from_message(1, &v, None, &cfg()).unwrap();
        assert_eq!(got.text, "");
        let media = got.media.unwrap();
        assert_eq!(
            (media.kind, media.mime.as_deref(), media.size),
            (TgMediaKind::Voice, Some("audio/ogg"), Some(1234))
        );

        let a = message(
            user(42),
            json!({"audio": {"file_id": "a1", "file_unique_id": "u", "duration": 60,
                              "file_name": "song.mp3", "mime_type": "audio/mpeg"}}),
        );
        let media = from_message(1, &a, None, &cfg()).unwrap().media.unwrap();
        assert_eq!(media.kind, TgMediaKind::Audio);
        assert_eq!(media.file_name.as_deref(), Some("song.mp3"));
        assert_eq!(
            media.size, None,
            "a missing file_size is unknown, not u32::MAX"
        );

        let d = message(
            user(42),
            json!({"caption": "the report", "document": {"file_id": "d1", "file_unique_id": "u",
                   "file_name": "r.pdf", "mime_type": "application/pdf", "file_size": 99}}),
        );
        let got = from_message(1, &d, None, &cfg()).unwrap();
        assert_eq!(got.text, "the report");
        let media = got.media.unwrap();
        assert_eq!(
            (
                media.kind,
                media.file_name.as_deref(),
                media.mime.as_deref()
            ),
            (
                TgMediaKind::Document,
                Some("r.pdf"),
                Some("application/pdf")
            )
        );
    }

    #[test]
    fn messages_without_content_are_ignored() {
        let sticker = message(
            user(42),
            json!({"sticker": {"file_id": "s", "file_unique_id": "u", "type": "regular",
                   "width": 512, "height": 512, "is_animated": false, "is_video": false}}),
        );
        assert!(from_message(1, &sticker, None, &cfg()).is_none());
        let blank = message(user(42), json!({"text": "   "}));
        assert!(from_message(1, &blank, None, &cfg()).is_none());
    }

    #[test]
    fn commands_are_parsed() {
        assert_eq!(commands::parse("/reset"), Some(ChatCommand::Reset));
        assert_eq!(commands::parse("/stop@agentd_bot"), Some(ChatCommand::Stop));
        assert_eq!(
            commands::parse("/status now please"),
            Some(ChatCommand::Status)
        );
        assert_eq!(commands::parse("/STOP"), Some(ChatCommand::Stop));
        assert_eq!(commands::parse("/start"), None);
        assert_eq!(commands::parse("reset"), None);
        assert_eq!(commands::parse("please /reset"), None);
        assert_eq!(commands::parse("/model"), Some(ChatCommand::Model(None)));
        assert_eq!(
            commands::parse("/model@agentd_bot cheap"),
            Some(ChatCommand::Model(Some("cheap".into())))
        );
        assert_eq!(commands::parse("/skills"), Some(ChatCommand::Skills));
        assert_eq!(
            commands::parse("/skill OFF weather"),
            Some(ChatCommand::Skill {
                enabled: Some(false),
                name: "weather".into()
            })
        );
        assert_eq!(
            commands::parse("/skill weather"),
            Some(ChatCommand::Skill {
                enabled: None,
                name: String::new()
            })
        );
        assert!(matches!(
            commands::parse("/skill on"),
            Some(ChatCommand::Skill { enabled: None, .. })
        ));
        assert_eq!(commands::parse(""), None);
        let m = message(user(42), json!({"text": "/reset"}));
        assert_eq!(
            from_message(1, &m, None, &cfg()).unwrap().is_command,
            Some(ChatCommand::Reset)
        );
        // A caption is never a command.
        let c = message(
            user(42),
            json!({"caption": "/reset", "document": {"file_id": "d", "file_unique_id": "u"}}),
        );
        assert_eq!(from_message(1, &c, None, &cfg()).unwrap().is_command, None);
    }

    proptest::proptest! {
        #[test]
        fn commands_only_from_a_leading_slash(text in ".{0,40}") {
            if commands::parse(&text).is_some() {
                proptest::prop_assert!(text.trim_start().starts_with('/'));
            }
        }
    }

    #[test]
    fn bot_id_comes_from_the_token() {
        assert_eq!(bot_id_from_token("123456:ABC-def"), Some(123456));
        assert_eq!(bot_id_from_token("garbage"), None);
    }
}

/// Property tests: updates are outside input, shaped by whatever Telegram (or a Bot API
/// server pretending to be it) sends.
#[cfg(test)]
mod prop_tests {

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::tests::cfg;
    use super::*;

    const BOT: i64 = 999;

    fn user(id: i64, is_bot: bool) -> Value {
        json!({"id": id, "is_bot": is_bot, "first_name": "Ann", "username": "ann", "language_code": "en"})
    }

    /// Updates of the shapes Telegram sends: text (with a command entity), photo with caption,
    /// voice, document, a group message, an edit, a channel post without `from`, a callback
    /// query, a kind agentd does not know.
    fn seed_updates(id: u32, from: i64, text: &str) -> Vec<Value> {
        let chat = json!({"id": from, "type": "private", "first_name": "Ann"});
        let msg = |extra: Value| {
            let mut m = json!({"message_id": 7, "from": user(from, false), "chat": chat, "date": 1_700_000_000});
            m.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            m
        };
        vec![
            json!({"update_id": id, "message": msg(json!({"text": text, "entities": [{"type": "bot_command", "offset": 0, "length": 1}]}))}),
            json!({"update_id": id, "message": msg(json!({"caption": text, "photo": [
                {"file_id": "s", "file_unique_id": "s1", "width": 90, "height": 90, "file_size": 100},
                {"file_id": "b", "file_unique_id": "b1", "width": 800, "height": 600}]}))}),
            json!({"update_id": id, "message": msg(json!({"voice": {"file_id": "v", "file_unique_id": "v1", "duration": 2, "mime_type": "audio/ogg"}}))}),
            json!({"update_id": id, "message": msg(json!({"document": {"file_id": "d", "file_unique_id": "d1", "file_name": "a.pdf"}, "caption": text}))}),
            json!({"update_id": id, "message": {"message_id": 8, "from": user(from, false), "date": 1,
                "chat": {"id": -100123, "type": "supergroup", "title": "G"}, "text": text}}),
            json!({"update_id": id, "edited_message": msg(json!({"text": text, "edit_date": 2}))}),
            json!({"update_id": id, "channel_post": {"message_id": 9, "date": 1,
                "chat": {"id": -100777, "type": "channel", "title": "C"}, "text": text}}),
            json!({"update_id": id, "callback_query": {"id": "q", "from": user(from, false), "chat_instance": "x", "data": text}}),
            json!({"update_id": id, "business_something_new": {"x": text}}),
        ]
    }

    /// Parse the way the poller receives updates: from text, as one batch.
    fn parse_batch(updates: &[Value]) -> Result<Vec<Update>, serde_json::Error> {
        serde_json::from_str(&Value::Array(updates.to_vec()).to_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any update with a valid `update_id` parses, however broken its content: one odd
        /// update must not make the whole batch fail, or the poller would fetch the same batch
        /// forever. What comes out is either ignored or a well-formed inbound message.
        #[test]
        fn broken_updates_never_stall_the_batch(
            id in 1u32..u32::MAX,
            from in prop_oneof![Just(42i64), Just(BOT), any::<i64>()],
            text in "\\PC{0,30}",
            which in any::<usize>(),
            edits in crate::proptest_json::edits(4),
        ) {
            let seeds = seed_updates(id, from, &text);
            let mut broken = crate::proptest_json::mutate(&seeds[which % seeds.len()], &edits);
            prop_assume!(broken.is_object());
            broken["update_id"] = json!(id);
            let batch = parse_batch(&[seeds[0].clone(), broken.clone(), seeds[1].clone()]);
            let batch = batch.map_err(|e| TestCaseError::fail(format!("{e}: {broken}")))?;
            prop_assert_eq!(batch.len(), 3);
            let u = &batch[1];
            prop_assert_eq!(u.id.0, id);
            if let Some(i) = from_update(u, Some(BOT), &cfg()) {
                prop_assert_eq!(i.update_id, i64::from(id));
                prop_assert!(!i.text.trim().is_empty() || i.media.is_some(), "{i:?}");
                prop_assert!(i.user_id != BOT, "the bot's own messages are ignored");
                if i.is_command.is_some() {
                    prop_assert!(i.text.trim_start().starts_with('/'), "{i:?}");
                }
                let msg = &broken["message"];
                prop_assert_eq!(json!(i.user_id), msg["from"]["id"].clone());
                prop_assert_eq!(json!(i.chat_id), msg["chat"]["id"].clone());
                prop_assert_eq!(
                    &i.from_name,
                    &if i.user_id == 42 { "Alice".to_string() } else { format!("tg:{}", i.user_id) }
                );
                prop_assert!(
                    i.session_key == i.from_name || i.session_key == group_key(i.chat_id),
                    "{i:?}"
                );
            }
        }

        /// The documented output for good input: a text message from a user is taken in with
        /// its text as sent, the contact name or `tg:<id>`, and a command only for our three.
        #[test]
        fn text_messages_are_taken_in_as_sent(
            id in 1u32..u32::MAX,
            from in prop_oneof![Just(42i64), 1i64..1_000_000_000_000],
            text in "\\PC{1,60}",
        ) {
            prop_assume!(!text.trim().is_empty() && from != BOT);
            let batch = parse_batch(&[seed_updates(id, from, &text)[0].clone()]).unwrap();
            let i = from_update(&batch[0], Some(BOT), &cfg()).expect("a text message is taken in");
            prop_assert_eq!(&i.text, &text);
            prop_assert_eq!(i.user_id, from);
            prop_assert_eq!(i.is_command, commands::parse(&text));
            prop_assert_eq!(i.media, None);
        }
    }
}
