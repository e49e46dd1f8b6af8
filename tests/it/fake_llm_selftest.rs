//! Self-tests of the fake LLM server: raw wire output checked with a plain HTTP client, the way
//! a provider client would see it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::support::fake_llm::{
    FakeLlm, GARBAGE, Reply, Usage, Wire, last_user_text, split_events, split_n,
};

const WAIT: Duration = Duration::from_secs(5);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("reqwest client")
}

fn endpoint(fake: &FakeLlm, wire: Wire) -> String {
    match wire {
        Wire::Anthropic => format!("{}/v1/messages", fake.base_url()),
        Wire::OpenAi => format!("{}/chat/completions", fake.base_url()),
    }
}

/// A request as the daemon's clients would send it (the Anthropic one with its headers).
fn request(
    client: &reqwest::Client,
    fake: &FakeLlm,
    wire: Wire,
    body: &Value,
) -> reqwest::RequestBuilder {
    let rb = client.post(endpoint(fake, wire)).json(body);
    match wire {
        Wire::Anthropic => rb
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", "test-key"),
        Wire::OpenAi => rb.bearer_auth("test-key"),
    }
}

async fn post(fake: &FakeLlm, wire: Wire, body: Value) -> reqwest::Response {
    request(&client(), fake, wire, &body)
        .send()
        .await
        .expect("request to the fake")
}

fn user_body(text: &str, stream: bool) -> Value {
    json!({
        "model": "test-model",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
}

/// Splits raw SSE text into `(event name, data)` pairs; asserts the framing.
fn sse_events(raw: &str) -> Vec<(Option<String>, String)> {
    assert!(
        raw.ends_with("\n\n"),
        "SSE body must end with a blank line: {raw:?}"
    );
    raw.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data.expect("every event has data"))
        })
        .collect()
}

/// Anthropic events as JSON, asserting that each `event:` name equals its data's `type`.
fn anthropic_events(raw: &str) -> Vec<Value> {
    sse_events(raw)
        .into_iter()
        .map(|(name, data)| {
            let v: Value = serde_json::from_str(&data).expect("event data is JSON");
            assert_eq!(
                name.as_deref(),
                v["type"].as_str(),
                "event name matches data type"
            );
            v
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

/// Reassembles Anthropic content blocks from stream events, like a client does; also returns
/// the number of deltas per block.
fn assemble_anthropic(events: &[Value]) -> (Vec<Value>, Vec<usize>) {
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut deltas: Vec<usize> = Vec::new();
    for e in events {
        match e["type"].as_str() {
            Some("content_block_start") => {
                assert_eq!(
                    e["index"],
                    json!(blocks.len()),
                    "blocks start in index order"
                );
                blocks.push(e["content_block"].clone());
                partial.push(String::new());
                deltas.push(0);
            }
            Some("content_block_delta") => {
                let i = e["index"].as_u64().expect("index") as usize;
                deltas[i] += 1;
                let d = &e["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        let t = format!(
                            "{}{}",
                            blocks[i]["text"].as_str().unwrap(),
                            d["text"].as_str().unwrap()
                        );
                        blocks[i]["text"] = json!(t);
                    }
                    Some("thinking_delta") => {
                        let t = format!(
                            "{}{}",
                            blocks[i]["thinking"].as_str().unwrap(),
                            d["thinking"].as_str().unwrap()
                        );
                        blocks[i]["thinking"] = json!(t);
                    }
                    Some("signature_delta") => blocks[i]["signature"] = d["signature"].clone(),
                    Some("input_json_delta") => {
                        partial[i].push_str(d["partial_json"].as_str().unwrap())
                    }
                    other => panic!("unexpected delta type {other:?}"),
                }
            }
            Some("content_block_stop") => {
                let i = e["index"].as_u64().expect("index") as usize;
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] =
                        serde_json::from_str(&partial[i]).expect("tool input JSON");
                }
            }
            _ => {}
        }
    }
    (blocks, deltas)
}

/// OpenAI stream lines: the JSON chunks, after asserting `data: [DONE]` comes last.
fn openai_chunks(raw: &str) -> Vec<Value> {
    let events = sse_events(raw);
    assert!(
        events.iter().all(|(name, _)| name.is_none()),
        "OpenAI sends no event names"
    );
    let (last, chunks) = events.split_last().expect("at least [DONE]");
    assert_eq!(last.1, "[DONE]");
    chunks
        .iter()
        .map(|(_, d)| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}

#[tokio::test]
async fn anthropic_stream_text_has_the_real_event_sequence() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::Text {
        text: "Hello, wörld! How are you?".into(),
        usage: Usage::new(100, 20, 300, 40),
    });
    let resp = post(&fake, Wire::Anthropic, user_body("hi", true)).await;
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let raw = resp.text().await.unwrap();
    assert!(raw.starts_with("event: message_start\ndata: {"), "{raw}");

    let events = anthropic_events(&raw);
    assert_eq!(
        types(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &events[0]["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["model"], "test-model");
    assert_eq!(start["content"], json!([]));
    assert_eq!(
        start["usage"],
        json!({"input_tokens": 100, "cache_creation_input_tokens": 40, "cache_read_input_tokens": 300, "output_tokens": 1})
    );
    let (blocks, _) = assemble_anthropic(&events);
    assert_eq!(
        blocks,
        [json!({"type": "text", "text": "Hello, wörld! How are you?"})]
    );
    let delta = &events[7];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 20);
}

#[tokio::test]
async fn anthropic_stream_thinking_text_and_tool_calls() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    let args1 = json!({"path": "/tmp/a \"quoted\" ü", "limit": 10});
    let args2 = json!({"command": "ls"});
    fake.push(Reply::Thinking {
        thinking: "Let me think about it".into(),
        signature: "sig-abc==".into(),
        then: Box::new(Reply::ToolCalls {
            text: Some("Checking.".into()),
            calls: vec![
                ("toolu_1".into(), "read".into(), args1.clone()),
                ("toolu_2".into(), "exec".into(), args2.clone()),
            ],
            usage: Usage::new(5, 50, 0, 0),
        }),
    });
    let raw = post(&fake, Wire::Anthropic, user_body("go", true))
        .await
        .text()
        .await
        .unwrap();
    let events = anthropic_events(&raw);
    let (blocks, deltas) = assemble_anthropic(&events);
    assert_eq!(
        blocks,
        [
            json!({"type": "thinking", "thinking": "Let me think about it", "signature": "sig-abc=="}),
            json!({"type": "text", "text": "Checking."}),
            json!({"type": "tool_use", "id": "toolu_1", "name": "read", "input": args1}),
            json!({"type": "tool_use", "id": "toolu_2", "name": "exec", "input": args2}),
        ]
    );
    // The tool input arrives as an empty start plus at least two pieces.
    assert!(deltas[2] >= 3 && deltas[3] >= 3, "{deltas:?}");
    // The signature delta is the last delta of the thinking block.
    let sig_pos = events
        .iter()
        .position(|e| e["delta"]["type"] == "signature_delta")
        .unwrap();
    assert_eq!(events[sig_pos + 1]["type"], "content_block_stop");
    let md = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(md["delta"]["stop_reason"], "tool_use");
    assert_eq!(md["usage"]["output_tokens"], 50);
    assert_eq!(types(&events).last(), Some(&"message_stop"));
}

#[tokio::test]
async fn anthropic_non_stream_message_and_max_tokens() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::tool_calls(vec![(
        "toolu_9",
        "read",
        json!({"path": "x"}),
    )]));
    fake.push(Reply::MaxTokens {
        text: "cut".into(),
        usage: Usage::new(1, 2, 3, 4),
    });
    let m: Value = post(&fake, Wire::Anthropic, user_body("a", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(
        m["content"],
        json!([{"type": "tool_use", "id": "toolu_9", "name": "read", "input": {"path": "x"}}])
    );
    assert_eq!(m["usage"]["output_tokens"], 5);

    let raw = post(&fake, Wire::Anthropic, user_body("b", true))
        .await
        .text()
        .await
        .unwrap();
    let events = anthropic_events(&raw);
    let md = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(md["delta"]["stop_reason"], "max_tokens");
    assert_eq!(events[0]["message"]["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(
        events[0]["message"]["usage"]["cache_creation_input_tokens"],
        4
    );
}

#[tokio::test]
async fn anthropic_requires_the_version_header_and_records_the_body() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::text("kept for the next request"));
    let resp = client()
        .post(endpoint(&fake, Wire::Anthropic))
        .json(&user_body("no header", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(
        fake.requests().len(),
        1,
        "rejected requests are recorded too"
    );
    assert_eq!(
        fake.pending_replies(),
        1,
        "a rejected request consumes no reply"
    );
}

#[tokio::test]
async fn wrong_path_is_a_404_and_not_recorded() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    // The classic mistake: an OpenAI-style base URL for Anthropic.
    let resp = client()
        .post(format!("{}/v1/v1/messages", fake.base_url()))
        .header("anthropic-version", "2023-06-01")
        .json(&user_body("x", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn openai_stream_text_tool_calls_and_usage_chunk() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    assert!(fake.base_url().ends_with("/v1"));
    let args0 = json!({"path": "/etc/hostname"});
    let args1 = json!({"query": "weather \"today\"", "count": 3});
    fake.push(Reply::ToolCalls {
        text: Some("Let me look.".into()),
        calls: vec![
            ("call_a".into(), "read".into(), args0.clone()),
            ("call_b".into(), "web_search".into(), args1.clone()),
        ],
        usage: Usage::new(100, 20, 300, 7),
    });
    let mut body = user_body("look", true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = post(&fake, Wire::OpenAi, body).await;
    assert_eq!(resp.status(), 200);
    let raw = resp.text().await.unwrap();
    assert!(raw.starts_with("data: {"), "{raw}");
    let chunks = openai_chunks(&raw);

    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], 400);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 20);
    assert_eq!(usage_chunk["usage"]["total_tokens"], 420);
    assert_eq!(
        usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"],
        300
    );

    let mut content = String::new();
    let mut calls: Vec<(String, String, String, usize)> = Vec::new();
    let mut finish = Vec::new();
    for c in rest {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["usage"],
            Value::Null,
            "usage is null before the usage chunk"
        );
        let choice = &c["choices"][0];
        assert_eq!(choice["index"], 0);
        if let Some(f) = choice["finish_reason"].as_str() {
            finish.push(f.to_string());
        }
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push((
                    tc["id"].as_str().expect("first delta has the id").into(),
                    tc["function"]["name"]
                        .as_str()
                        .expect("first delta has the name")
                        .into(),
                    String::new(),
                    0,
                ));
            }
            calls[i]
                .2
                .push_str(tc["function"]["arguments"].as_str().unwrap());
            calls[i].3 += 1;
        }
    }
    assert_eq!(rest[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(content, "Let me look.");
    assert_eq!(finish, ["tool_calls"]);
    assert_eq!(
        rest.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].0.as_str(), calls[0].1.as_str()),
        ("call_a", "read")
    );
    assert_eq!(
        (calls[1].0.as_str(), calls[1].1.as_str()),
        ("call_b", "web_search")
    );
    assert_eq!(serde_json::from_str::<Value>(&calls[0].2).unwrap(), args0);
    assert_eq!(serde_json::from_str::<Value>(&calls[1].2).unwrap(), args1);
    assert!(
        calls.iter().all(|c| c.3 >= 3),
        "arguments split across chunks: {calls:?}"
    );
}

#[tokio::test]
async fn openai_stream_without_include_usage_and_default_echo() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    let body = json!({
        "model": "gpt-test",
        "stream": true,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
        ],
    });
    let raw = post(&fake, Wire::OpenAi, body).await.text().await.unwrap();
    let chunks = openai_chunks(&raw);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "{raw}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "echo: hi there");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(chunks[0]["model"], "gpt-test");
}

#[tokio::test]
async fn openai_non_stream_completion_and_length() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    fake.push(Reply::tool_calls(vec![(
        "call_1",
        "exec",
        json!({"command": "ls"}),
    )]));
    fake.push(Reply::MaxTokens {
        text: "trunc".into(),
        usage: Usage::new(10, 4096, 6, 0),
    });
    let c: Value = post(&fake, Wire::OpenAi, user_body("a", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(c["object"], "chat.completion");
    let choice = &c["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "exec");
    let args = call["function"]["arguments"]
        .as_str()
        .expect("arguments is a JSON string");
    assert_eq!(
        serde_json::from_str::<Value>(args).unwrap(),
        json!({"command": "ls"})
    );

    let c: Value = post(&fake, Wire::OpenAi, user_body("b", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(c["choices"][0]["finish_reason"], "length");
    assert_eq!(c["choices"][0]["message"]["content"], "trunc");
    assert_eq!(c["usage"]["prompt_tokens"], 16);
    assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
}

#[tokio::test]
async fn errors_carry_status_shape_and_retry_after() {
    let anthropic = FakeLlm::start(Wire::Anthropic).await;
    anthropic.push(Reply::Error {
        status: 529,
        message: "Overloaded".into(),
        retry_after: Some(7),
    });
    anthropic.push(Reply::error(400, "bad request"));
    let resp = post(&anthropic, Wire::Anthropic, user_body("x", true)).await;
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(resp.headers()["retry-after"], "7");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    let resp = post(&anthropic, Wire::Anthropic, user_body("x", true)).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.headers().get("retry-after").is_none());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let openai = FakeLlm::start(Wire::OpenAi).await;
    openai.push(Reply::Error {
        status: 429,
        message: "Rate limit reached".into(),
        retry_after: Some(3),
    });
    let resp = post(&openai, Wire::OpenAi, user_body("x", true)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["message"], "Rate limit reached");
    assert!(body["error"]["type"].is_string());
}

#[tokio::test]
async fn gated_reply_waits_for_a_permit() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    let gate = Arc::new(Semaphore::new(0));
    fake.push(Reply::text("after the gate").gated(&gate));
    let f = fake.clone();
    let call = tokio::spawn(async move {
        post(&f, Wire::Anthropic, user_body("x", false))
            .await
            .json::<Value>()
            .await
            .unwrap()
    });
    fake.wait_for_requests(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !call.is_finished(),
        "the gated call must not be answered before a permit"
    );
    gate.add_permits(1);
    let m = tokio::time::timeout(WAIT, call)
        .await
        .expect("answered after the permit")
        .unwrap();
    assert_eq!(m["content"][0]["text"], "after the gate");
}

#[tokio::test]
async fn two_gated_calls_are_in_flight_at_once() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    let gate = Arc::new(Semaphore::new(0));
    fake.push(Reply::text("one").gated(&gate));
    fake.push(Reply::text("two").gated(&gate));
    let calls: Vec<_> = (0..2)
        .map(|i| {
            let f = fake.clone();
            tokio::spawn(async move {
                post(&f, Wire::OpenAi, user_body(&format!("call {i}"), false))
                    .await
                    .json::<Value>()
                    .await
                    .unwrap()
            })
        })
        .collect();
    // Both requests reach the fake while neither is answered: a barrier.
    fake.wait_for_requests(2, WAIT).await;
    gate.add_permits(2);
    let mut answers = Vec::new();
    for c in calls {
        let v = tokio::time::timeout(WAIT, c).await.unwrap().unwrap();
        answers.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    answers.sort();
    assert_eq!(answers, ["one", "two"]);
}

#[tokio::test]
async fn requests_are_recorded_in_order_with_headers() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::error(500, "boom"));
    fake.push(Reply::text("ok"));
    assert_eq!(
        post(&fake, Wire::Anthropic, user_body("first", false))
            .await
            .status(),
        500
    );
    assert_eq!(
        post(&fake, Wire::Anthropic, user_body("second", false))
            .await
            .status(),
        200
    );
    let bodies = fake.wait_for_requests(2, WAIT).await;
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["messages"][0]["content"], "first");
    assert_eq!(bodies[1]["messages"][0]["content"], "second");
    let headers = fake.request_headers();
    assert_eq!(headers[1]["anthropic-version"], "2023-06-01");
    assert_eq!(headers[1]["x-api-key"], "test-key");
    assert_eq!(fake.pending_replies(), 0);
}

#[tokio::test]
async fn empty_script_echoes_the_last_user_text() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    let body = json!({
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": [{"type": "text", "text": "hm"}]},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "text", "text": "more"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        ],
    });
    let m: Value = post(&fake, Wire::Anthropic, body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["content"][0]["text"], "echo: second\nmore");
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(
        m["usage"],
        json!({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
    );
}

#[tokio::test]
async fn hang_never_answers_but_other_calls_proceed() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::Hang);
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = request(&short, &fake, Wire::Anthropic, &user_body("x", true))
        .send()
        .await
        .expect_err("a hanging call must time out");
    assert!(err.is_timeout(), "{err}");
    let m: Value = post(&fake, Wire::Anthropic, user_body("still alive", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["content"][0]["text"], "echo: still alive");
}

#[tokio::test]
async fn shutdown_closes_hanging_connections_and_the_port() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    fake.push(Reply::Hang);
    let f = fake.clone();
    let call = tokio::spawn(async move {
        request(&client(), &f, Wire::OpenAi, &user_body("x", true))
            .send()
            .await
    });
    fake.wait_for_requests(1, WAIT).await;
    let addr = fake.addr();
    fake.shutdown();
    let res = tokio::time::timeout(WAIT, call)
        .await
        .expect("shutdown ends the hanging call")
        .unwrap();
    assert!(res.is_err(), "the connection was closed without an answer");
    crate::support::wait_until(WAIT, "the port to close", || {
        std::net::TcpStream::connect(addr).is_err().then_some(())
    });
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_server() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    let addr = fake.addr();
    let clone = fake.clone();
    drop(fake);
    assert!(
        std::net::TcpStream::connect(addr).is_ok(),
        "a clone keeps it running"
    );
    drop(clone);
    crate::support::wait_until(WAIT, "the port to close", || {
        std::net::TcpStream::connect(addr).is_err().then_some(())
    });
}

/// Reads a body until it ends or breaks; returns the bytes and whether it broke.
async fn read_until_break(resp: reqwest::Response) -> (String, bool) {
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), false)
}

/// The text carried by the complete events of a (possibly cut) stream of either wire.
fn streamed_text(raw: &str) -> String {
    let complete = &raw[..raw.rfind("\n\n").map_or(0, |i| i + 2)];
    if complete.is_empty() {
        return String::new();
    }
    sse_events(complete)
        .into_iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(&data).ok())
        .filter_map(|v| {
            v["delta"]["text"]
                .as_str()
                .or(v["choices"][0]["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test]
async fn drop_mid_stream_sends_a_prefix_then_breaks() {
    let anthropic = FakeLlm::start(Wire::Anthropic).await;
    anthropic.push(Reply::DropMidStream {
        text: "Hello world, this is cut".into(),
    });
    let resp = post(&anthropic, Wire::Anthropic, user_body("x", true)).await;
    assert_eq!(resp.status(), 200);
    let (got, broke) = read_until_break(resp).await;
    assert!(broke, "the body must end with a transport error: {got}");
    assert!(got.contains("event: message_start"), "{got}");
    assert!(got.contains("text_delta"), "{got}");
    assert!(
        !got.contains("message_stop") && !got.contains("content_block_stop"),
        "{got}"
    );
    assert_eq!(
        streamed_text(&got),
        "Hello world,",
        "the first half of the text: {got}"
    );

    let openai = FakeLlm::start(Wire::OpenAi).await;
    openai.push(Reply::DropMidStream {
        text: "Hello world, this is cut".into(),
    });
    let (got, broke) =
        read_until_break(post(&openai, Wire::OpenAi, user_body("x", true)).await).await;
    assert!(broke, "{got}");
    assert_eq!(
        streamed_text(&got),
        "Hello world,",
        "the first half of the text: {got}"
    );
    assert!(
        !got.contains("[DONE]") && !got.contains("\"finish_reason\":\"stop\""),
        "{got}"
    );
}

#[tokio::test]
async fn garbage_is_unparsable() {
    let fake = FakeLlm::start(Wire::Anthropic).await;
    fake.push(Reply::Garbage);
    fake.push(Reply::Garbage);
    let resp = post(&fake, Wire::Anthropic, user_body("x", false)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert_eq!(text, GARBAGE);
    assert!(serde_json::from_str::<Value>(&text).is_err());
    let raw = post(&fake, Wire::Anthropic, user_body("x", true))
        .await
        .text()
        .await
        .unwrap();
    let events = sse_events(&raw);
    assert!(
        events
            .iter()
            .all(|(_, d)| serde_json::from_str::<Value>(d).is_err()),
        "{raw}"
    );
}

#[tokio::test]
#[should_panic(expected = "expected at least 1 request(s)")]
async fn wait_for_requests_panics_clearly_on_timeout() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    fake.wait_for_requests(1, Duration::from_millis(50)).await;
}

#[test]
fn spawn_works_without_a_runtime() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let m: Value = rt.block_on(async {
        post(&fake, Wire::Anthropic, user_body("sync", false))
            .await
            .json()
            .await
            .unwrap()
    });
    assert_eq!(m["content"][0]["text"], "echo: sync");
}

#[test]
fn last_user_text_handles_both_wires() {
    assert_eq!(last_user_text(&json!({})), "");
    assert_eq!(
        last_user_text(&json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ]})),
        "a"
    );
    assert_eq!(
        last_user_text(&json!({"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}, {"type": "text", "text": "b"}]},
        ]})),
        "b"
    );
}

/// A recorded stream with llama-server's keep-alive comments, a content chunk, the usage chunk
/// and a last event cut without its blank line: replayed as is.
const RECORDED: &[u8] = b":\n\n:\n\ndata: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"h\\u00e9\"}}],\"object\":\"chat.completion.chunk\"}\n\ndata: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}]}\n\ndata: [DONE]";

#[tokio::test]
async fn raw_sse_replays_the_recorded_bytes_event_by_event() {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    fake.push(Reply::RawSse(RECORDED.to_vec().into()));
    let resp = post(&fake, Wire::OpenAi, user_body("x", true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = stream.next().await {
        got.extend_from_slice(&chunk.expect("body chunk"));
        chunks += 1;
    }
    assert_eq!(got, RECORDED, "{}", String::from_utf8_lossy(&got));
    assert!(chunks >= 2, "one chunk per event, got {chunks}");
    assert_eq!(fake.requests().len(), 1);

    // A non-streaming request cannot be answered with an event stream.
    fake.push(Reply::RawSse(RECORDED.to_vec().into()));
    let resp = post(&fake, Wire::OpenAi, user_body("x", false)).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("streaming"),
        "{body}"
    );
}

/// Every recording in `tests/fixtures/local-model/` is a complete OpenAI event stream (ends
/// with `data: [DONE]`), and the fake sends it back byte for byte.
#[tokio::test]
async fn every_recorded_fixture_replays_byte_for_byte() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/local-model");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/local-model")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".sse")
                .map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 6, "recordings: {names:?}");
    let fake = FakeLlm::start(Wire::OpenAi).await;
    for name in &names {
        let recorded = std::fs::read(dir.join(format!("{name}.sse"))).unwrap();
        let text = String::from_utf8(recorded.clone()).expect("UTF-8");
        assert!(
            text.trim_end().ends_with("data: [DONE]"),
            "{name}: no [DONE]"
        );
        for event in text.split("\n\n").filter(|e| e.starts_with("data: {")) {
            serde_json::from_str::<Value>(&event["data: ".len()..])
                .unwrap_or_else(|e| panic!("{name}: {e}: {event}"));
        }
        fake.push(Reply::recorded(name));
        let resp = post(&fake, Wire::OpenAi, user_body("x", true)).await;
        assert_eq!(resp.status(), 200, "{name}");
        let got = resp.bytes().await.unwrap();
        assert_eq!(&got[..], &recorded[..], "{name}");
    }
}

#[test]
fn split_events_cuts_after_blank_lines_and_rejoins() {
    let bytes = axum::body::Bytes::from_static(RECORDED);
    let pieces = split_events(&bytes);
    assert_eq!(pieces.concat(), RECORDED);
    assert_eq!(&pieces[0][..], b":\n\n");
    assert_eq!(&pieces[1][..], b":\n\n");
    assert_eq!(&pieces[pieces.len() - 1][..], b"data: [DONE]");
    assert_eq!(pieces.len(), 5);
    assert!(split_events(&axum::body::Bytes::new()).is_empty());
    assert_eq!(
        split_events(&axum::body::Bytes::from_static(b"\n\n\n")).len(),
        2
    );
}

#[test]
fn split_n_examples() {
    assert!(split_n("", 3).is_empty());
    assert_eq!(split_n("ab", 3), ["a", "b"]);
    assert_eq!(split_n("abcdefg", 3), ["abc", "def", "g"]);
    assert_eq!(split_n("äöü", 2), ["äö", "ü"]);
}

proptest! {
    #[test]
    fn split_n_rejoins_and_splits_enough(s in ".{0,40}", n in 1usize..6) {
        let pieces = split_n(&s, n);
        prop_assert_eq!(pieces.concat(), s.clone());
        prop_assert!(pieces.len() <= n);
        prop_assert!(pieces.iter().all(|p| !p.is_empty()));
        let chars = s.chars().count();
        if chars >= 2 && n >= 2 {
            prop_assert!(pieces.len() >= 2, "{:?}", pieces);
        }
    }
}
