//! The fake Telegram Bot API server checked with a plain HTTP client (its wire behaviour), then
//! agentd's Telegram client and poller (`channels::telegram`) run against it.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use agentd::channels::telegram::client::{FileKind, TelegramClient, TgError};
use agentd::channels::telegram::inbound::{TgInbound, TgMediaKind};
use agentd::channels::telegram::poll::{
    OffsetStore, PollHealth, PollOptions, TgSink, health_channel, run_with,
};
use agentd::channels::telegram::split::split_message;
use agentd::config::{TelegramConfig, TelegramFormat};

use crate::support::fake_telegram::{
    CONFLICT_DESCRIPTION, FakeTelegram, MAX_TEXT_UTF16, parse_telegram_html,
};

const TOKEN: &str = "4242:AAE-fake_token_for_tests_0123456789";
const SECRET: &str = "AAE-fake_token_for_tests_0123456789";
const WAIT: Duration = Duration::from_secs(10);
const ALICE: i64 = 42;

// ---------------------------------------------------------------------------------------------
// The fake, seen through plain HTTP.
// ---------------------------------------------------------------------------------------------

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("reqwest client")
}

fn method_url(fake: &FakeTelegram, method: &str) -> String {
    format!("{}/bot{TOKEN}/{method}", fake.api_url())
}

/// POSTs JSON to `method`; returns `(status, body)`.
async fn call(fake: &FakeTelegram, method: &str, body: Value) -> (u16, Value) {
    let resp = http()
        .post(method_url(fake, method))
        .json(&body)
        .send()
        .await
        .expect("request to the fake");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

fn ok_result(status: u16, body: &Value) -> Value {
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], json!(true), "{body}");
    body["result"].clone()
}

fn update_ids(result: &Value) -> Vec<i64> {
    result
        .as_array()
        .expect("array of updates")
        .iter()
        .map(|u| u["update_id"].as_i64().expect("update_id"))
        .collect()
}

#[tokio::test]
async fn long_poll_waits_and_returns_on_push() {
    let fake = FakeTelegram::spawn(TOKEN);
    let f2 = fake.clone();
    let started = Instant::now();
    let poll = tokio::spawn(async move { call(&f2, "getUpdates", json!({"timeout": 10})).await });
    fake.wait_for_polls(1, WAIT).await;
    // Still waiting: nothing was pushed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "a long poll with no updates must wait");
    let pushed = fake.push_text(ALICE, ALICE, "hello");
    let (status, body) = tokio::time::timeout(WAIT, poll).await.unwrap().unwrap();
    let result = ok_result(status, &body);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered on push, not at the timeout"
    );
    assert_eq!(update_ids(&result), vec![pushed.update_id]);
    let msg = &result[0]["message"];
    assert_eq!(msg["text"], "hello");
    assert_eq!(msg["from"]["id"], ALICE);
    assert_eq!(msg["chat"]["id"], ALICE);
    assert_eq!(msg["message_id"], pushed.message_id);

    // With nothing queued, the timeout passes and the answer is empty.
    let fake2 = FakeTelegram::spawn(TOKEN);
    let t = Instant::now();
    let (status, body) = call(&fake2, "getUpdates", json!({"timeout": 1})).await;
    assert_eq!(ok_result(status, &body), json!([]));
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn offset_confirms_and_limit_applies() {
    let fake = FakeTelegram::spawn(TOKEN);
    let a = fake.push_text(ALICE, ALICE, "a").update_id;
    let b = fake.push_text(ALICE, ALICE, "b").update_id;
    let c = fake.push_text(ALICE, ALICE, "c").update_id;
    let (s, body) = call(&fake, "getUpdates", json!({"offset": 0})).await;
    assert_eq!(update_ids(&ok_result(s, &body)), vec![a, b, c]);
    // Without a higher offset nothing is confirmed: the same updates come again.
    let (s, body) = call(&fake, "getUpdates", json!({"limit": 2})).await;
    assert_eq!(update_ids(&ok_result(s, &body)), vec![a, b]);
    // offset = b confirms a.
    let (s, body) = call(&fake, "getUpdates", json!({"offset": b})).await;
    assert_eq!(update_ids(&ok_result(s, &body)), vec![b, c]);
    assert_eq!(fake.pending_update_ids(), vec![b, c]);
    let (s, body) = call(&fake, "getUpdates", json!({"offset": c + 1, "timeout": 0})).await;
    assert_eq!(ok_result(s, &body), json!([]));
    assert!(fake.pending_update_ids().is_empty());
    let calls = fake.get_updates_calls();
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[1].limit, Some(2));
    assert_eq!(calls[2].offset, Some(b));
}

#[tokio::test]
async fn allowed_updates_filter_and_is_remembered() {
    let fake = FakeTelegram::spawn(TOKEN);
    let m = fake.push_text(ALICE, ALICE, "m").update_id;
    fake.push_update(
        "edited_message",
        json!({"message_id": 1, "date": 1, "edit_date": 2, "text": "e",
               "from": {"id": ALICE, "is_bot": false, "first_name": "A"},
               "chat": {"id": ALICE, "type": "private", "first_name": "A"}}),
    );
    let (s, body) = call(
        &fake,
        "getUpdates",
        json!({"allowed_updates": ["message"], "timeout": 0}),
    )
    .await;
    assert_eq!(update_ids(&ok_result(s, &body)), vec![m]);
    // Remembered: a later call without allowed_updates still filters.
    fake.push_update("callback_query", json!({"id": "1"}));
    let (s, body) = call(&fake, "getUpdates", json!({"offset": m + 1})).await;
    assert_eq!(ok_result(s, &body), json!([]));
    assert_eq!(
        fake.get_updates_calls()[0].allowed_updates,
        Some(vec!["message".to_string()])
    );
}

#[tokio::test]
async fn inline_keyboards_callbacks_answers_and_edits() {
    let fake = FakeTelegram::spawn(TOKEN);
    let keyboard = json!({"inline_keyboard": [[{"text": "Yes", "callback_data": "ap:x:a"}]]});
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "ok?", "reply_markup": keyboard}),
    )
    .await;
    let mid = ok_result(s, &body)["message_id"].as_i64().unwrap();
    assert_eq!(fake.sent()[0].buttons, vec!["ap:x:a".to_string()]);
    let long = json!({"inline_keyboard": [[{"text": "x", "callback_data": "d".repeat(65)}]]});
    let (s, _) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "x", "reply_markup": long}),
    )
    .await;
    assert_eq!(s, 400, "callback data over 64 bytes is refused");

    let q = fake.push_callback(ALICE, ALICE, mid, "ap:x:a");
    let (s, body) = call(
        &fake,
        "getUpdates",
        json!({"allowed_updates": ["message", "callback_query"], "timeout": 0}),
    )
    .await;
    let got = ok_result(s, &body);
    assert_eq!(got[0]["callback_query"]["id"], q.as_str());
    assert_eq!(got[0]["callback_query"]["data"], "ap:x:a");
    let (s, _) = call(
        &fake,
        "answerCallbackQuery",
        json!({"callback_query_id": q, "text": "Approved."}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = call(
        &fake,
        "answerCallbackQuery",
        json!({"callback_query_id": q}),
    )
    .await;
    assert_eq!(s, 400, "a query is answered once");
    assert_eq!(
        fake.callback_answers()[0].text.as_deref(),
        Some("Approved.")
    );

    let (s, _) = call(
        &fake,
        "editMessageText",
        json!({"chat_id": ALICE, "message_id": mid, "text": "done", "reply_markup": {"inline_keyboard": []}}),
    )
    .await;
    assert_eq!(s, 200);
    let e = &fake.edits()[0];
    assert_eq!((e.message_id, e.text.as_str()), (mid, "done"));
    assert!(e.buttons.is_empty());
    let (s, _) = call(
        &fake,
        "editMessageText",
        json!({"chat_id": ALICE, "message_id": 999_999, "text": "x"}),
    )
    .await;
    assert_eq!(s, 400, "an unknown message cannot be edited");
}

#[tokio::test]
async fn injected_failures_have_telegrams_shape() {
    let fake = FakeTelegram::spawn(TOKEN);
    fake.fail_next(1, 409);
    fake.fail_next(1, 500);
    fake.fail_next(1, 502);
    let (s, body) = call(&fake, "getUpdates", json!({})).await;
    assert_eq!(s, 409);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 409, "description": CONFLICT_DESCRIPTION})
    );
    let (s, body) = call(&fake, "getUpdates", json!({})).await;
    assert_eq!(
        (s, &body["description"]),
        (500, &json!("Internal Server Error"))
    );
    let (s, body) = call(&fake, "getUpdates", json!({})).await;
    assert_eq!(s, 502);
    assert!(body.as_str().unwrap().contains("502 Bad Gateway"), "{body}");
    let (s, body) = call(&fake, "getUpdates", json!({})).await;
    assert_eq!(ok_result(s, &body), json!([]));
    assert_eq!(
        [409, 500, 502, 401].map(|st| fake.served_failures(st)),
        [1, 1, 1, 0]
    );

    // A wrong token is 401 Unauthorized, for every method.
    let resp = http()
        .post(format!("{}/bot1:wrong/getMe", fake.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 401, "description": "Unauthorized"})
    );
    // An unknown method is 404 Not Found.
    let (s, body) = call(&fake, "noSuchMethod", json!({})).await;
    assert_eq!((s, &body["description"]), (404, &json!("Not Found")));
}

#[tokio::test]
async fn a_newer_poll_ends_the_older_one_with_409() {
    let fake = FakeTelegram::spawn(TOKEN);
    let f2 = fake.clone();
    let first = tokio::spawn(async move { call(&f2, "getUpdates", json!({"timeout": 10})).await });
    fake.wait_for_polls(1, WAIT).await;
    let f3 = fake.clone();
    let second = tokio::spawn(async move { call(&f3, "getUpdates", json!({"timeout": 10})).await });
    let (s, body) = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    assert_eq!(
        (s, &body["description"]),
        (409, &json!(CONFLICT_DESCRIPTION))
    );
    let id = fake.push_text(ALICE, ALICE, "x").update_id;
    let (s, body) = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    assert_eq!(update_ids(&ok_result(s, &body)), vec![id]);
}

#[tokio::test]
async fn hanging_poll_never_answers() {
    let fake = FakeTelegram::spawn(TOKEN);
    fake.hang_next_poll();
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let err = short
        .post(method_url(&fake, "getUpdates"))
        .json(&json!({"timeout": 0}))
        .send()
        .await
        .expect_err("a hanging poll must not answer");
    assert!(err.is_timeout(), "{err}");
    let (s, body) = call(&fake, "getUpdates", json!({"timeout": 0})).await;
    assert_eq!(ok_result(s, &body), json!([]));
    assert_eq!(fake.get_updates_calls().len(), 2);
}

#[tokio::test]
async fn flood_answers_429_with_retry_after_once() {
    let fake = FakeTelegram::spawn(TOKEN);
    fake.flood(7);
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "hi"}),
    )
    .await;
    assert_eq!(s, 429);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 7",
               "parameters": {"retry_after": 7}})
    );
    assert!(fake.sent().is_empty());
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "hi"}),
    )
    .await;
    let msg = ok_result(s, &body);
    assert_eq!(msg["text"], "hi");
    assert_eq!(fake.sent().len(), 1);
}

#[test]
fn html_checker_behaves_like_telegram() {
    assert_eq!(
        parse_telegram_html("<b>bold</b> &amp; <i>it</i> &lt;x&gt; &#128512; &#x41; &quot;")
            .unwrap(),
        "bold & it <x> 😀 A \""
    );
    assert_eq!(
        parse_telegram_html(
            r#"<a href="https://x.y">l</a><pre><code class="language-rust">fn</code></pre>"#
        )
        .unwrap(),
        "lfn"
    );
    assert_eq!(
        parse_telegram_html(r#"<span class="tg-spoiler">s</span><tg-spoiler>t</tg-spoiler>"#)
            .unwrap(),
        "st"
    );
    // A bare ampersand that starts no entity is kept.
    assert_eq!(parse_telegram_html("a & b").unwrap(), "a & b");
    for (bad, why) in [
        (
            "<b>open",
            "Can't find end tag corresponding to start tag \"b\"",
        ),
        (
            "<b><i>x</b></i>",
            "Unmatched end tag at byte offset 7, expected \"</i>\", found \"</b>\"",
        ),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        (
            "<div>x</div>",
            "Unsupported start tag \"div\" at byte offset 0",
        ),
        ("a < b", "Unclosed start tag"),
        ("<span>x</span>", "must have class \"tg-spoiler\""),
        ("<br/>", "Unsupported start tag \"br\""),
    ] {
        let err = parse_telegram_html(bad).expect_err(bad);
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

#[tokio::test]
async fn send_message_checks_html_and_length() {
    let fake = FakeTelegram::spawn(TOKEN);
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "<b>x", "parse_mode": "HTML"}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        body["description"],
        "Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"b\""
    );
    // The limit counts UTF-16 units after entity parsing: 4096 "&amp;" is 4096 characters.
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "&amp;".repeat(4096), "parse_mode": "HTML"}),
    )
    .await;
    assert_eq!(ok_result(s, &body)["text"], "&".repeat(4096));
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "x".repeat(4097)}),
    )
    .await;
    assert_eq!(
        (s, &body["description"]),
        (400, &json!("Bad Request: message is too long"))
    );
    // An emoji is 2 UTF-16 units: 2049 of them are too long, 2048 fit.
    let (s, _) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "😀".repeat(2049)}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "😀".repeat(2048)}),
    )
    .await;
    ok_result(s, &body);
    let (s, body) = call(
        &fake,
        "sendMessage",
        json!({"chat_id": ALICE, "text": "  "}),
    )
    .await;
    assert_eq!(
        (s, &body["description"]),
        (400, &json!("Bad Request: message text is empty"))
    );
    let sent = fake.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(sent[0].plain, "&".repeat(4096));
    assert!(sent[1].message_id > sent[0].message_id);
}

#[tokio::test]
async fn method_names_are_case_insensitive_and_forms_work() {
    let fake = FakeTelegram::spawn(TOKEN);
    for m in ["getMe", "GetMe", "getme", "GETME"] {
        let (s, body) = call(&fake, m, json!({})).await;
        let me = ok_result(s, &body);
        assert_eq!(me["id"], 4242, "{m}");
        for key in [
            "is_bot",
            "first_name",
            "username",
            "can_join_groups",
            "can_read_all_group_messages",
            "supports_inline_queries",
            "can_connect_to_business",
            "has_main_web_app",
        ] {
            assert!(me.get(key).is_some(), "getMe lacks {key}: {me}");
        }
    }
    // A url-encoded form body and a query string, as curl users send them.
    let resp = http()
        .post(method_url(&fake, "SendMessage"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "chat_id={ALICE}&text=a%20b+c%26d&reply_to_message_id=999"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        400,
        "replying to an unknown message"
    );
    let pushed = fake.push_text(ALICE, ALICE, "q");
    let resp = http()
        .get(format!(
            "{}?chat_id={ALICE}&text=a%20b+c%26d&reply_parameters=%7B%22message_id%22%3A{}%7D",
            method_url(&fake, "sendmessage"),
            pushed.message_id
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "a b c&d");
    assert_eq!(sent[0].reply_to, Some(pushed.message_id));
}

#[tokio::test]
async fn chat_actions_and_reactions_are_validated_and_recorded() {
    let fake = FakeTelegram::spawn(TOKEN);
    let (s, body) = call(
        &fake,
        "sendChatAction",
        json!({"chat_id": ALICE, "action": "typing"}),
    )
    .await;
    assert_eq!(ok_result(s, &body), json!(true));
    let (s, _) = call(
        &fake,
        "sendChatAction",
        json!({"chat_id": ALICE, "action": "dancing"}),
    )
    .await;
    assert_eq!(s, 400);
    let m = fake.push_text(ALICE, ALICE, "x").message_id;
    let ok =
        json!({"chat_id": ALICE, "message_id": m, "reaction": [{"type": "emoji", "emoji": "👍"}]});
    let (s, body) = call(&fake, "setMessageReaction", ok).await;
    assert_eq!(ok_result(s, &body), json!(true));
    let bad =
        json!({"chat_id": ALICE, "message_id": m, "reaction": [{"type": "emoji", "emoji": "🦀"}]});
    let (s, body) = call(&fake, "setMessageReaction", bad).await;
    assert_eq!(
        (s, &body["description"]),
        (400, &json!("Bad Request: REACTION_INVALID"))
    );
    let missing = json!({"chat_id": ALICE, "message_id": 99999, "reaction": []});
    let (s, body) = call(&fake, "setMessageReaction", missing).await;
    assert_eq!(
        (s, &body["description"]),
        (400, &json!("Bad Request: message to react not found"))
    );
    assert_eq!(fake.actions().len(), 1);
    assert_eq!(fake.actions()[0].action, "typing");
    let r = fake.reactions();
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].chat_id, r[0].message_id, r[0].emoji.clone()),
        (ALICE, m, vec!["👍".to_string()])
    );
}

#[tokio::test]
async fn get_file_and_download() {
    let fake = FakeTelegram::spawn(TOKEN);
    let pushed = fake.push_voice(ALICE, ALICE, b"OggS voice bytes", 3);
    let file_id = pushed.file_id.unwrap();
    let (s, body) = call(&fake, "getFile", json!({"file_id": file_id})).await;
    let file = ok_result(s, &body);
    assert_eq!(file["file_size"], 16);
    let path = file["file_path"].as_str().unwrap();
    assert!(
        path.starts_with("voice/") && path.ends_with(".oga"),
        "{path}"
    );
    let resp = http()
        .get(format!("{}/file/bot{TOKEN}/{path}", fake.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(&resp.bytes().await.unwrap()[..], b"OggS voice bytes");
    let (s, body) = call(&fake, "getFile", json!({"file_id": "nope"})).await;
    assert_eq!(
        (s, &body["description"]),
        (400, &json!("Bad Request: invalid file_id"))
    );
    let resp = http()
        .get(format!("{}/file/bot{TOKEN}/voice/none.oga", fake.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
}

// ---------------------------------------------------------------------------------------------
// agentd's client and poller against the fake.
// ---------------------------------------------------------------------------------------------

fn tg_cfg(fake: &FakeTelegram) -> TelegramConfig {
    TelegramConfig {
        enabled: true,
        token_env: "AGENTD_TELEGRAM_TOKEN".into(),
        token: Some(SecretString::from(TOKEN)),
        api_url: fake.api_url(),
        allow_from: vec![ALICE],
        contacts: BTreeMap::from([("Alice".to_string(), ALICE)]),
        text_chunk_limit: 4096,
        poll_timeout: Duration::from_secs(1),
        max_download_bytes: 1 << 20,
        format: TelegramFormat::Html,
    }
}

fn fast_opts() -> PollOptions {
    PollOptions {
        hang_slack: Duration::from_secs(2),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        live: None,
    }
}

#[derive(Default)]
struct MemOffsets {
    saved: Mutex<Vec<i64>>,
}

impl MemOffsets {
    fn saved(&self) -> Vec<i64> {
        self.saved.lock().unwrap().clone()
    }
}

impl OffsetStore for MemOffsets {
    fn load(&self) -> BoxFuture<'_, Option<i64>> {
        Box::pin(async move { self.saved.lock().unwrap().last().copied() })
    }
    fn save(&self, offset: i64) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.saved.lock().unwrap().push(offset) })
    }
}

/// Records accepted messages; fails the calls whose 0-based index is in `fail_attempts`.
struct RecordingSink {
    got: Mutex<Vec<TgInbound>>,
    attempts: AtomicUsize,
    fail_attempts: Vec<usize>,
    count: watch::Sender<usize>,
}

impl RecordingSink {
    fn new(fail_attempts: &[usize]) -> Arc<RecordingSink> {
        Arc::new(RecordingSink {
            got: Mutex::new(Vec::new()),
            attempts: AtomicUsize::new(0),
            fail_attempts: fail_attempts.to_vec(),
            count: watch::channel(0).0,
        })
    }

    fn got(&self) -> Vec<TgInbound> {
        self.got.lock().unwrap().clone()
    }

    fn texts(&self) -> Vec<String> {
        self.got().into_iter().map(|m| m.text).collect()
    }

    async fn wait_len(&self, n: usize) -> Vec<TgInbound> {
        let mut rx = self.count.subscribe();
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("sink: expected {n} message(s), got {:?}", self.texts()))
            .unwrap();
        self.got()
    }
}

impl TgSink for RecordingSink {
    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
            if self.fail_attempts.contains(&attempt) {
                return Err("disk full".to_string());
            }
            self.got.lock().unwrap().push(msg);
            self.count.send_modify(|c| *c += 1);
            Ok(())
        })
    }
}

struct Poller {
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<Result<(), TgError>>,
    health: watch::Receiver<PollHealth>,
}

impl Poller {
    fn start(
        cfg: TelegramConfig,
        offsets: Arc<MemOffsets>,
        sink: Arc<dyn TgSink>,
        opts: PollOptions,
    ) -> Poller {
        let client = TelegramClient::new(&cfg).expect("client");
        let (tx, rx) = health_channel();
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(run_with(
            client,
            cfg,
            offsets,
            sink,
            tx,
            cancel.clone(),
            opts,
        ));
        Poller {
            cancel,
            handle,
            health: rx,
        }
    }

    async fn wait_health(&mut self, what: &str, f: impl FnMut(&PollHealth) -> bool) -> PollHealth {
        let waited = tokio::time::timeout(Duration::from_secs(30), self.health.wait_for(f))
            .await
            .map(|r| r.map(|h| h.clone()));
        match waited {
            Ok(Ok(h)) => h,
            _ => panic!(
                "poller health never showed {what}: {:?}",
                *self.health.borrow()
            ),
        }
    }

    /// Cancels and checks the loop ends promptly and cleanly.
    async fn stop(self) {
        self.cancel.cancel();
        let r = tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("the poller must stop promptly on cancellation")
            .expect("poller task");
        assert!(r.is_ok(), "{r:?}");
    }
}

#[tokio::test]
async fn poller_delivers_in_order_persists_offset_and_resumes_without_redelivery() {
    let fake = FakeTelegram::spawn(TOKEN);
    let ids: Vec<i64> = ["one", "two", "three"]
        .iter()
        .map(|t| fake.push_text(ALICE, ALICE, t).update_id)
        .collect();
    let offsets = Arc::new(MemOffsets::default());
    let sink = RecordingSink::new(&[]);
    let p = Poller::start(tg_cfg(&fake), offsets.clone(), sink.clone(), fast_opts());
    let got = sink.wait_len(3).await;
    assert_eq!(sink.texts(), ["one", "two", "three"]);
    assert_eq!(got[0].from_name, "Alice");
    assert_eq!(got[0].update_id, ids[0]);
    assert_eq!(offsets.saved(), vec![ids[0] + 1, ids[1] + 1, ids[2] + 1]);
    // The next poll confirms them with Telegram.
    fake.wait_for(WAIT, "updates confirmed", |f| {
        f.pending_update_ids().is_empty()
    })
    .await;
    let calls = fake.get_updates_calls();
    assert_eq!(calls[0].offset, Some(0));
    assert_eq!(calls[0].timeout, Some(1));
    // Messages, and button presses (SPEC §18: inline buttons).
    assert_eq!(
        calls[0].allowed_updates,
        Some(vec!["message".to_string(), "callback_query".to_string()])
    );
    p.stop().await;

    // A restart resumes from the stored offset: only the new message arrives.
    let four = fake.push_text(ALICE, ALICE, "four").update_id;
    let polls_before = fake.get_updates_calls().len();
    let p = Poller::start(tg_cfg(&fake), offsets.clone(), sink.clone(), fast_opts());
    sink.wait_len(4).await;
    assert_eq!(sink.texts(), ["one", "two", "three", "four"]);
    assert_eq!(
        fake.get_updates_calls()[polls_before].offset,
        Some(ids[2] + 1)
    );
    assert_eq!(offsets.saved().last(), Some(&(four + 1)));
    p.stop().await;
    assert_eq!(sink.got().len(), 4, "nothing delivered twice");
}

#[tokio::test]
async fn a_sink_error_keeps_the_offset_and_the_update_comes_again() {
    let fake = FakeTelegram::spawn(TOKEN);
    let a = fake.push_text(ALICE, ALICE, "a").update_id;
    let b = fake.push_text(ALICE, ALICE, "b").update_id;
    let c = fake.push_text(ALICE, ALICE, "c").update_id;
    let offsets = Arc::new(MemOffsets::default());
    // The intake of b fails once.
    let sink = RecordingSink::new(&[1]);
    let p = Poller::start(tg_cfg(&fake), offsets.clone(), sink.clone(), fast_opts());
    sink.wait_len(3).await;
    assert_eq!(sink.texts(), ["a", "b", "c"]);
    assert_eq!(
        sink.attempts.load(Ordering::SeqCst),
        4,
        "b was offered twice, c once"
    );
    assert_eq!(
        offsets.saved(),
        vec![a + 1, b + 1, c + 1],
        "no offset saved for the failed intake"
    );
    let calls = fake.get_updates_calls();
    assert_eq!(calls[0].offset, Some(0));
    assert_eq!(
        calls[1].offset,
        Some(b),
        "the poll after the failure asks for b again"
    );
    assert!(
        p.health
            .borrow()
            .last_error
            .as_deref()
            .unwrap()
            .contains("disk full")
    );
    p.stop().await;
}

/// Takes `slow` for each message of chat `slow_chat`, then records it (as a download or a
/// transcription would hold it).
struct SlowChatSink {
    inner: Arc<RecordingSink>,
    slow_chat: i64,
    slow: Duration,
}

impl TgSink for SlowChatSink {
    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if msg.chat_id == self.slow_chat {
                tokio::time::sleep(self.slow).await;
            }
            self.inner.accept(msg).await
        })
    }
}

/// Security round 3, item 5: each chat is its own lane. Alice's slow messages (2 s each) hold
/// neither Bob's message (recorded within 1 s) nor each other's order; the saved offset never
/// passes an update whose intake is not done, so a stop while Alice's second message is in
/// flight offers exactly it, her third and Bob's again to the next run (Bob's is a repeat the
/// intake drops by its id).
#[tokio::test]
async fn a_slow_chat_holds_no_other_and_the_offset_waits_for_it() {
    const BOB: i64 = 77;
    let fake = FakeTelegram::spawn(TOKEN);
    let mut cfg = tg_cfg(&fake);
    cfg.allow_from.push(BOB);
    let a: Vec<i64> = ["a1", "a2", "a3"]
        .iter()
        .map(|t| fake.push_text(ALICE, ALICE, t).update_id)
        .collect();
    let offsets = Arc::new(MemOffsets::default());
    let recorded = RecordingSink::new(&[]);
    let sink = Arc::new(SlowChatSink {
        inner: recorded.clone(),
        slow_chat: ALICE,
        slow: Duration::from_secs(2),
    });
    let p = Poller::start(cfg.clone(), offsets.clone(), sink, fast_opts());
    fake.wait_for_polls(1, WAIT).await;
    let t0 = Instant::now();
    let b = fake.push_text(BOB, BOB, "b1").update_id;
    recorded.wait_len(1).await;
    let took = t0.elapsed();
    eprintln!(
        "Bob's message recorded {} ms after it was sent, behind Alice's slow ones",
        took.as_millis()
    );
    assert_eq!(recorded.texts(), ["b1"]);
    assert!(took <= Duration::from_secs(1), "{took:?}");
    assert!(
        offsets.saved().is_empty(),
        "offset passed Alice's unfinished a1: {:?}",
        offsets.saved()
    );
    recorded.wait_len(2).await;
    assert_eq!(recorded.texts(), ["b1", "a1"]);
    // a2 is in flight: only a1 is behind the saved offset.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(offsets.saved(), vec![a[0] + 1]);
    p.stop().await;

    let again = RecordingSink::new(&[]);
    let p = Poller::start(cfg, offsets.clone(), again.clone(), fast_opts());
    again.wait_len(3).await;
    let mut texts = again.texts();
    texts.sort();
    assert_eq!(
        texts,
        ["a2", "a3", "b1"],
        "exactly the unfinished ones and Bob's repeat"
    );
    fake.wait_for(WAIT, "updates confirmed", |f| {
        f.pending_update_ids().is_empty()
    })
    .await;
    assert_eq!(offsets.saved().last(), Some(&(b + 1)));
    assert!(a[2] < b);
    p.stop().await;
}

#[tokio::test]
async fn conflict_and_server_error_storms_are_survived() {
    let fake = FakeTelegram::spawn(TOKEN);
    fake.fail_next(3, 409);
    fake.fail_next(1, 502);
    let offsets = Arc::new(MemOffsets::default());
    let sink = RecordingSink::new(&[]);
    let opts = PollOptions {
        hang_slack: Duration::from_secs(20),
        ..fast_opts()
    };
    let mut p = Poller::start(tg_cfg(&fake), offsets, sink.clone(), opts);
    let h = p
        .wait_health("3 consecutive errors", |h| h.consecutive_errors >= 3)
        .await;
    assert!(h.last_error.as_deref().unwrap().contains("409"), "{h:?}");
    assert!(h.last_poll_ok_at.is_none());
    assert_eq!(fake.served_failures(409), 3);
    fake.push_text(ALICE, ALICE, "after the storm");
    sink.wait_len(1).await;
    let h = p
        .wait_health("recovery", |h| {
            h.consecutive_errors == 0 && h.last_poll_ok_at.is_some()
        })
        .await;
    assert_eq!(h.restarts, 0, "{h:?}");
    // The 502 (an nginx page, not the Bot API's JSON) was seen as a server error.
    assert!(
        h.last_error
            .as_deref()
            .unwrap()
            .contains("server error 502"),
        "{h:?}"
    );
    assert!(fake.get_updates_calls().len() >= 5);
    p.stop().await;
}

#[tokio::test]
async fn a_hanging_poll_is_detected_and_restarted() {
    let fake = FakeTelegram::spawn(TOKEN);
    fake.hang_next_poll();
    let sink = RecordingSink::new(&[]);
    let opts = PollOptions {
        hang_slack: Duration::from_secs(1),
        ..fast_opts()
    };
    let mut p = Poller::start(
        tg_cfg(&fake),
        Arc::new(MemOffsets::default()),
        sink.clone(),
        opts,
    );
    let h = p.wait_health("a restart", |h| h.restarts >= 1).await;
    assert!(h.last_error.is_some());
    fake.push_text(ALICE, ALICE, "still alive");
    sink.wait_len(1).await;
    assert_eq!(sink.texts(), ["still alive"]);
    p.stop().await;
}

#[tokio::test]
async fn cancellation_ends_a_long_poll_promptly() {
    let fake = FakeTelegram::spawn(TOKEN);
    let mut cfg = tg_cfg(&fake);
    cfg.poll_timeout = Duration::from_secs(30);
    let p = Poller::start(
        cfg,
        Arc::new(MemOffsets::default()),
        RecordingSink::new(&[]),
        fast_opts(),
    );
    fake.wait_for_polls(1, WAIT).await;
    p.stop().await;
}

/// A tracing writer into a shared buffer, to check what the poller logs.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn disallowed_senders_bots_and_other_updates_are_skipped_and_logged() {
    let logs = LogBuf::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // The current-thread test runtime runs the poller on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = FakeTelegram::spawn(TOKEN);
    let stranger = fake.push_text(5550123, 5550123, "let me in").update_id;
    fake.push_update(
        "message",
        json!({"message_id": 900, "date": 1, "text": "from myself",
               "from": {"id": 4242, "is_bot": true, "first_name": "Fake Bot", "username": "fake_agentd_bot"},
               "chat": {"id": ALICE, "type": "private", "first_name": "A"}}),
    );
    let last = fake.push_text(ALICE, ALICE, "hi").update_id;
    let offsets = Arc::new(MemOffsets::default());
    let sink = RecordingSink::new(&[]);
    let p = Poller::start(tg_cfg(&fake), offsets.clone(), sink.clone(), fast_opts());
    sink.wait_len(1).await;
    assert_eq!(sink.texts(), ["hi"]);
    assert_eq!(
        offsets.saved(),
        vec![stranger + 1, stranger + 2, last + 1],
        "skipped updates are confirmed too"
    );
    p.stop().await;
    let text = logs.text();
    assert!(
        text.contains("message from user 5550123 rejected; add it to allow_from to allow"),
        "{text}"
    );
    assert!(!text.contains(SECRET), "{text}");
}

#[tokio::test]
async fn long_replies_are_split_within_telegrams_limit() {
    let fake = FakeTelegram::spawn(TOKEN);
    let client = TelegramClient::new(&tg_cfg(&fake)).unwrap();
    // 9,000 characters with emoji (2 UTF-16 units each): about 10,500 units.
    let text: String = (0..1800).map(|i| format!("w{:02}😀 ", i % 100)).collect();
    assert_eq!(text.chars().count(), 9000);
    let ids = client
        .send_reply(ALICE, &text, TelegramFormat::Plain, MAX_TEXT_UTF16)
        .await
        .expect("every chunk accepted by the fake");
    let sent = fake.sent();
    assert!(sent.len() >= 3, "{} messages", sent.len());
    assert_eq!(
        ids,
        sent.iter().map(|m| m.message_id as i32).collect::<Vec<_>>()
    );
    for m in &sent {
        assert!(m.plain.encode_utf16().count() <= MAX_TEXT_UTF16);
        assert_eq!(m.parse_mode, None);
    }
    let texts: Vec<String> = sent.iter().map(|m| m.text.clone()).collect();
    assert_eq!(
        texts,
        split_message(&text, MAX_TEXT_UTF16),
        "the splitter's chunks, in order"
    );
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(squash(&texts.concat()), squash(&text));

    // HTML: markup characters expand when escaped, but Telegram counts the visible text.
    let fake = FakeTelegram::spawn(TOKEN);
    let client = TelegramClient::new(&tg_cfg(&fake)).unwrap();
    let text: String = (0..1000).map(|i| format!("a<b&{:04} ", i)).collect();
    assert_eq!(text.chars().count(), 9000);
    client
        .send_reply(ALICE, &text, TelegramFormat::Html, MAX_TEXT_UTF16)
        .await
        .expect("every chunk accepted");
    let sent = fake.sent();
    assert!(sent.len() >= 3);
    assert!(sent.iter().all(|m| m.parse_mode.as_deref() == Some("HTML")));
    let plain: String = sent.iter().map(|m| m.plain.clone()).collect();
    assert_eq!(squash(&plain), squash(&text));
}

#[tokio::test]
async fn rejected_html_falls_back_to_plain_text() {
    let fake = FakeTelegram::spawn(TOKEN);
    let client = TelegramClient::new(&tg_cfg(&fake)).unwrap();
    fake.reject_next_html();
    let ids = client
        .send_reply(ALICE, "**bold** and <b>", TelegramFormat::Html, 4096)
        .await
        .unwrap();
    assert_eq!(ids.len(), 1);
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].parse_mode, None);
    assert_eq!(
        sent[0].text, "bold and <b>",
        "the fallback strips the Markdown markers"
    );
    let tries: Vec<Value> = fake
        .requests()
        .into_iter()
        .filter(|(m, _)| m == "sendmessage")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(tries.len(), 2);
    assert_eq!(tries[0]["parse_mode"], "HTML");
}

#[tokio::test]
async fn flood_control_is_waited_out() {
    let fake = FakeTelegram::spawn(TOKEN);
    let client = TelegramClient::new(&tg_cfg(&fake)).unwrap();
    fake.flood(1);
    let t = Instant::now();
    let ids = client
        .send_reply(ALICE, "hello", TelegramFormat::Plain, 4096)
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "retried before retry_after"
    );
    assert_eq!(ids.len(), 1);
    assert_eq!(fake.sent().len(), 1);
    let tries = fake
        .requests()
        .iter()
        .filter(|(m, _)| m == "sendmessage")
        .count();
    assert_eq!(tries, 2);
}

#[tokio::test]
async fn typing_reactions_files_and_get_me() {
    let fake = FakeTelegram::spawn(TOKEN);
    let client = TelegramClient::new(&tg_cfg(&fake)).unwrap();
    let me = client.get_me().await.unwrap();
    assert_eq!(me.id, 4242);
    assert_eq!(me.username.as_deref(), Some("fake_agentd_bot"));
    client.send_typing(ALICE).await.unwrap();
    assert_eq!(fake.actions()[0].action, "typing");
    let m = fake.push_text(ALICE, ALICE, "nice").message_id;
    client.react(ALICE, m as i32, "👍").await.unwrap();
    assert_eq!(fake.reactions()[0].emoji, vec!["👍".to_string()]);
    let e = client.react(ALICE, m as i32, "🦀").await.unwrap_err();
    assert!(
        matches!(&e, TgError::Api(d) if d.contains("REACTION_INVALID")),
        "{e:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let photo = dir.path().join("chart.png");
    std::fs::write(&photo, b"\x89PNG fake image").unwrap();
    let id = client
        .send_file(ALICE, &photo, FileKind::Photo, Some("the chart"))
        .await
        .unwrap();
    let doc = dir.path().join("report.pdf");
    std::fs::write(&doc, b"%PDF-1.7").unwrap();
    client
        .send_file(ALICE, &doc, FileKind::Document, None)
        .await
        .unwrap();
    let files = fake.sent_files();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0].method, "sendphoto");
    assert_eq!(files[0].message_id, i64::from(id));
    assert_eq!(files[0].file_name.as_deref(), Some("chart.png"));
    assert_eq!(files[0].bytes, b"\x89PNG fake image");
    assert_eq!(files[0].caption.as_deref(), Some("the chart"));
    assert_eq!(files[1].method, "senddocument");
    assert_eq!(files[1].bytes, b"%PDF-1.7");
    let e = client
        .send_file(
            ALICE,
            &dir.path().join("missing.ogg"),
            FileKind::Voice,
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, TgError::Io(_)), "{e:?}");
}

#[tokio::test]
async fn downloads_are_named_private_and_size_capped() {
    let fake = FakeTelegram::spawn(TOKEN);
    let cfg = tg_cfg(&fake);
    let client = TelegramClient::new(&cfg).unwrap();
    let sink = RecordingSink::new(&[]);
    fake.push_photo(ALICE, ALICE, b"big jpeg bytes", Some("look"));
    fake.push_voice(ALICE, ALICE, &[7u8; 300], 2);
    let p = Poller::start(
        cfg,
        Arc::new(MemOffsets::default()),
        sink.clone(),
        fast_opts(),
    );
    let got = sink.wait_len(2).await;
    p.stop().await;
    assert_eq!(got[0].text, "look");
    let photo = got[0].media.clone().expect("photo media");
    assert_eq!(photo.kind, TgMediaKind::Photo);
    let voice = got[1].media.clone().expect("voice media");
    assert_eq!(voice.kind, TgMediaKind::Voice);

    let dir = tempfile::tempdir().unwrap();
    let inbox = dir.path().join("inbox");
    let path = client.download(&photo.file_id, &inbox, 1024).await.unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"big jpeg bytes",
        "the largest size"
    );
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let (ts, rest) = name.split_once('-').unwrap();
    assert!(ts.parse::<i64>().unwrap() > 1_600_000_000, "{name}");
    assert!(rest.starts_with("AgAD") && rest.ends_with(".jpg"), "{name}");
    assert_eq!(path.parent().unwrap(), inbox);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The same file again gets a fresh name.
    let again = client.download(&photo.file_id, &inbox, 1024).await.unwrap();
    assert_ne!(again, path);

    let e = client
        .download(&voice.file_id, &inbox, 100)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        TgError::TooLarge {
            size: 300,
            max: 100
        }
    );
    assert_eq!(
        std::fs::read_dir(&inbox).unwrap().count(),
        2,
        "nothing left of the refused file"
    );

    // A failed download leaves no partial file and no token in the error.
    fake.expire_downloads(true);
    let e = client
        .download(&voice.file_id, &inbox, 1024)
        .await
        .unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(matches!(e, TgError::Network(_)), "{text}");
    assert!(text.contains("404"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert_eq!(std::fs::read_dir(&inbox).unwrap().count(), 2);
}

#[tokio::test]
async fn the_token_never_appears_in_errors_or_health() {
    let fake = FakeTelegram::spawn(TOKEN);
    // A wrong token: 401 from the fake.
    let mut cfg = tg_cfg(&fake);
    cfg.token = Some(SecretString::from("4242:WRONG-secret-value-123456"));
    let client = TelegramClient::new(&cfg).unwrap();
    let e = client.get_me().await.unwrap_err();
    assert_eq!(e, TgError::Unauthorized);
    assert!(e.to_string().contains("401"), "{e}");

    // The poller with the wrong token keeps running and reports it.
    let mut p = Poller::start(
        cfg,
        Arc::new(MemOffsets::default()),
        RecordingSink::new(&[]),
        fast_opts(),
    );
    let h = p.wait_health("the 401", |h| h.last_error.is_some()).await;
    assert!(
        h.last_error.as_deref().unwrap().contains("token rejected"),
        "{h:?}"
    );
    // Red, with an alert naming the variable to fix (SPEC §16.7).
    assert_eq!(
        h.state,
        agentd::channels::telegram::poll::PollState::Unauthorized
    );
    assert!(!h.healthy, "{h:?}");
    assert!(
        h.alert.as_deref().is_some_and(|a| a.contains("401")),
        "{h:?}"
    );
    assert!(!format!("{h:?}").contains("WRONG-secret"), "{h:?}");
    assert!(
        !p.handle.is_finished(),
        "a rejected token never ends the poller"
    );
    p.stop().await;

    // Nobody listening: a network error whose URL carries the token.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = tg_cfg(&fake);
    cfg.api_url = format!("http://{dead}");
    let client = TelegramClient::new(&cfg).unwrap();
    let errors = vec![
        client
            .get_updates(0, Duration::from_secs(1))
            .await
            .unwrap_err(),
        client
            .send_reply(ALICE, "x", TelegramFormat::Html, 4096)
            .await
            .unwrap_err(),
        client
            .download("f", &std::env::temp_dir(), 10)
            .await
            .unwrap_err(),
    ];
    for e in errors {
        let text = format!("{e} {e:?}");
        assert!(matches!(e, TgError::Network(_)), "{text}");
        assert!(!text.contains(SECRET), "{text}");
    }
    let mut p = Poller::start(
        cfg,
        Arc::new(MemOffsets::default()),
        RecordingSink::new(&[]),
        fast_opts(),
    );
    let h = p
        .wait_health("a network error", |h| h.consecutive_errors >= 2)
        .await;
    assert!(!h.last_error.as_deref().unwrap().contains(SECRET), "{h:?}");
    p.stop().await;
}
