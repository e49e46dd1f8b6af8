use serde_json::json;

use super::*;

fn send(message: Value) -> Result<SendParams, RpcError> {
    parse_send(&json!({ "message": message }))
}

fn user(parts: Value) -> Value {
    json!({"kind": "message", "role": "user", "messageId": "m-1", "parts": parts})
}

#[test]
fn calls_are_checked_with_the_json_rpc_codes() {
    let code_of = |body: &str| parse_call(body.as_bytes()).unwrap_err().1.code;
    assert_eq!(code_of("{nope"), code::PARSE_ERROR);
    assert_eq!(code_of("[]"), code::INVALID_REQUEST);
    assert_eq!(code_of(r#"{"id":1,"method":"x"}"#), code::INVALID_REQUEST);
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
        code::INVALID_REQUEST
    );
    let (id, e) = parse_call(br#"{"jsonrpc":"2.0","id":7,"method":3}"#).unwrap_err();
    assert_eq!((id, e.code), (json!(7), code::INVALID_REQUEST));
    let c = parse_call(br#"{"jsonrpc":"2.0","id":"a","method":"tasks/get","params":{"id":"x"}}"#)
        .unwrap();
    assert_eq!((c.id, c.method.as_str()), (json!("a"), "tasks/get"));
}

#[test]
fn a_message_gives_its_text_images_and_ids() {
    let p = parse_send(&json!({
        "message": {
            "kind": "message", "role": "user", "messageId": "m-1", "contextId": "ctx-1",
            "parts": [
                {"kind": "text", "text": "hello"},
                {"kind": "file", "file": {"bytes": "iVBORw0=", "mimeType": "image/png"}},
                {"kind": "text", "text": "there"}
            ]
        },
        "configuration": {"blocking": false, "historyLength": 1}
    }))
    .unwrap();
    assert_eq!(p.text, "hello\n\nthere");
    assert_eq!(p.images.len(), 1);
    assert_eq!(p.images[0].content_type, "image/png");
    assert_eq!(
        (p.message_id.as_str(), p.context_id.as_deref()),
        ("m-1", Some("ctx-1"))
    );
    assert!(!p.blocking);
    assert_eq!(p.history_length, Some(1));
    assert!(
        send(user(json!([{"kind": "text", "text": "hi"}])))
            .unwrap()
            .blocking
    );
}

#[test]
fn other_parts_and_bad_fields_are_refused_clearly() {
    let code_of = |m: Value| send(m).unwrap_err().code;
    let data = user(json!([{"kind": "data", "data": {"a": 1}}]));
    assert_eq!(code_of(data), code::CONTENT_TYPE_NOT_SUPPORTED);
    let uri = user(json!([{"kind": "file", "file": {"uri": "https://x/y.png"}}]));
    assert_eq!(code_of(uri), code::CONTENT_TYPE_NOT_SUPPORTED);
    let pdf =
        user(json!([{"kind": "file", "file": {"bytes": "AA==", "mimeType": "application/pdf"}}]));
    let e = send(pdf).unwrap_err();
    assert_eq!(e.code, code::CONTENT_TYPE_NOT_SUPPORTED);
    assert!(
        e.message.contains("parts[0]") && e.message.contains("image/png"),
        "{}",
        e.message
    );
    let garbled =
        user(json!([{"kind": "file", "file": {"bytes": "not base64!", "mimeType": "image/png"}}]));
    let e = send(garbled).unwrap_err();
    assert_eq!(e.code, code::INVALID_PARAMS);
    assert!(e.message.contains("parts[0].file.bytes"), "{}", e.message);
    let many: Vec<Value> = (0..=MAX_PARTS)
        .map(|_| json!({"kind": "text", "text": "x"}))
        .collect();
    assert_eq!(code_of(user(json!(many))), code::INVALID_PARAMS);
    assert_eq!(code_of(user(json!([]))), code::INVALID_PARAMS, "no text");
    let mut agent = user(json!([{"kind": "text", "text": "x"}]));
    agent["role"] = json!("agent");
    assert_eq!(code_of(agent), code::INVALID_PARAMS);
    let mut bad_id = user(json!([{"kind": "text", "text": "x"}]));
    bad_id["messageId"] = json!("a b/c");
    assert_eq!(code_of(bad_id), code::INVALID_PARAMS);
    let mut long_ctx = user(json!([{"kind": "text", "text": "x"}]));
    long_ctx["contextId"] = json!("x".repeat(129));
    assert_eq!(code_of(long_ctx), code::INVALID_PARAMS);
    let push = parse_send(&json!({
        "message": user(json!([{"kind": "text", "text": "x"}])),
        "configuration": {"pushNotificationConfig": {"url": "https://x"}}
    }));
    assert_eq!(push.unwrap_err().code, code::PUSH_NOT_SUPPORTED);
}

#[test]
fn task_ids_name_their_context_and_message() {
    let id = task_id("ctx-1", "m:2");
    assert_eq!(parse_task_id(&id), Some(("ctx-1".into(), "m:2".into())));
    assert_eq!(parse_task_id("plain"), None);
    assert_eq!(parse_task_id("a~b c"), None);
    assert_eq!(session_key("ctx-1"), "a2a:ctx-1");
    let long = session_key(&"c".repeat(100));
    assert!(
        long.starts_with("a2a:h-") && crate::channels::intake::valid_key(&long),
        "{long}"
    );
    assert_eq!(long, session_key(&"c".repeat(100)), "stable");
}

#[test]
fn a_completed_task_carries_the_reply_as_artifact_and_message() {
    let end = TaskEnd::Completed {
        text: "the answer".into(),
    };
    let view = TaskView {
        context_id: "c",
        intake_id: "m",
        text: "the question",
        end: Some(&end),
        history_length: None,
    };
    let t = task(&view);
    assert_eq!(t["id"], "c~m");
    assert_eq!(t["status"]["state"], "completed");
    assert_eq!(t["artifacts"][0]["parts"][0]["text"], "the answer");
    assert_eq!(t["history"][0]["parts"][0]["text"], "the question");
    assert_eq!(t["history"][1]["role"], "agent");
    let short = task(&TaskView {
        history_length: Some(1),
        ..view.clone()
    });
    assert_eq!(short["history"].as_array().unwrap().len(), 1);
    assert_eq!(short["history"][0]["role"], "agent");
    assert_eq!(status_update(&view)["final"], true);
    let working = TaskEnd::Working;
    let w = status_update(&TaskView {
        end: Some(&working),
        ..view
    });
    assert_eq!(
        (w["final"].clone(), w["status"]["state"].clone()),
        (json!(false), json!("working"))
    );
}

#[test]
fn the_public_card_shows_no_skills() {
    let skills = vec![("notes".to_string(), "Take notes".to_string())];
    let info = |skills| CardInfo {
        name: "ada",
        url: "http://h/a2a",
        skills,
    };
    let public = card(&info(None));
    assert_eq!(public["skills"], json!([]));
    assert_eq!(public["supportsAuthenticatedExtendedCard"], true);
    assert_eq!(public["protocolVersion"], PROTOCOL_VERSION);
    let full = card(&info(Some(&skills)));
    assert_eq!(full["skills"][0]["id"], "notes");
}
