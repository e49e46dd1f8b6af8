//! Client-side function tools on the compatible endpoints (SPEC §17), through the official
//! `openai` and `anthropic` Python SDKs against the real daemon and a scripted provider: the
//! client sends a tool, the model calls it, the SDK gets the call in its own format, the
//! client sends the result (a persistent session, and a one-off one with the whole history),
//! the model reads it and answers. Plus the refusals (a name clash, a result for a call never
//! made), agentd's own call beside a client call, and the streamed forms.

use serde_json::{Value, json};

use crate::compat::{daemon, run_clients};
use crate::support::fake_llm::{
    FakeLlm, Reply, Usage, Wire, last_user_text, tool_results_in_last_message,
};

/// The scripted model: a question about the weather calls the client's `get_weather` (and,
/// for "(mixed)", agentd's own `session_status` first); results in the last message are
/// answered with what they say.
fn responder(body: &Value) -> Option<Reply> {
    let usage = Usage::new(20, 5, 0, 0);
    let results = tool_results_in_last_message(body);
    // A message that comes with the error results of calls the client left open.
    if last_user_text(body).ends_with("never mind") {
        return Some(Reply::Text {
            text: "plain answer".into(),
            usage,
        });
    }
    if !results.is_empty() {
        let sunny = results.iter().any(|r| r.contains("18 C and sunny"));
        return Some(Reply::Text {
            text: if sunny {
                "It is 18 C and sunny in Paris.".into()
            } else {
                format!("no weather in {results:?}")
            },
            usage,
        });
    }
    let question = last_user_text(body);
    let Some(tag) = question
        .split_once("weather in Paris? (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(tag, _)| tag.replace(['-', ' '], "_"))
    else {
        return Some(Reply::Text {
            text: "plain answer".into(),
            usage,
        });
    };
    let mut calls = vec![(
        format!("toolu_{tag}"),
        "get_weather".to_string(),
        json!({"city": "Paris"}),
    )];
    if tag == "mixed" {
        calls.insert(0, ("toolu_own".into(), "session_status".into(), json!({})));
    }
    Some(Reply::ToolCalls {
        text: Some("Checking.".into()),
        calls,
        usage,
    })
}

/// The trail lines of `key` that are messages with `role`.
fn messages(d: &crate::support::daemon::TestDaemon, key: &str, role: &str) -> Vec<Value> {
    d.trail(key)
        .into_iter()
        .filter(|l| l["type"] == "message" && l["role"] == role)
        .collect()
}

#[test]
fn client_tools_round_trip_through_the_official_sdks() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(responder);
    let (mut d, base) = daemon(&fake, "");
    let steps = run_clients(&base, "client_tools");

    // Chat completions, persistent session and one-off: the call in OpenAI's format, then
    // the final answer from the result.
    for (step, tag) in [
        ("oai_session", "oai_session"),
        ("oai_one_off", "oai_one_off"),
    ] {
        let s = &steps[step];
        assert_eq!(s["finish"], "tool_calls", "{s}");
        assert_eq!(
            s["calls"],
            json!([{"id": format!("toolu_{tag}"), "name": "get_weather", "arguments": {"city": "Paris"}}]),
            "{s}"
        );
        assert_eq!(s["final"], "It is 18 C and sunny in Paris.", "{s}");
        assert_eq!(s["final_finish"], "stop", "{s}");
    }
    // Messages, persistent session and one-off: a tool_use block, then the answer.
    for (step, tag) in [
        ("ant_session", "ant_session"),
        ("ant_one_off", "ant_one_off"),
    ] {
        let s = &steps[step];
        assert_eq!(s["stop"], "tool_use", "{s}");
        assert_eq!(
            s["calls"],
            json!([{"id": format!("toolu_{tag}"), "name": "get_weather", "input": {"city": "Paris"}}]),
            "{s}"
        );
        assert_eq!(s["final"], "It is 18 C and sunny in Paris.", "{s}");
        assert_eq!(s["final_stop"], "end_turn", "{s}");
    }

    // The model was offered the client's tool beside agentd's, and read the result as
    // untrusted content.
    let requests = fake.requests();
    let first = requests
        .iter()
        .find(|r| last_user_text(r).contains("(oai session)"))
        .expect("the question reached the provider");
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"get_weather") && names.contains(&"session_status"),
        "{names:?}"
    );
    let answered = requests
        .iter()
        .find(|r| {
            tool_results_in_last_message(r)
                .iter()
                .any(|t| t.contains("18 C and sunny"))
        })
        .expect("a result reached the provider");
    let result = tool_results_in_last_message(answered).join("");
    assert!(result.contains("untrusted-content"), "{result}");

    // The trail of the persistent session holds the call (the final answer of the first
    // request, its client call open) and the result (the start of the second).
    let assistants = messages(&d, "api:tools-oai", "assistant");
    let call = assistants
        .iter()
        .find(|l| l["client_calls"] == json!(["toolu_oai_session"]))
        .expect("the call is recorded");
    assert_eq!(call["final"], true);
    assert_eq!(call["tool_calls"][0]["name"], "get_weather");
    let results = messages(&d, "api:tools-oai", "tool_results");
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(
        results[0]["results"][0]["tool_call_id"],
        "toolu_oai_session"
    );
    assert!(
        results[0]["reply_to"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    );

    // Streamed: the call as delta.tool_calls chunks / a tool_use block.
    let s = &steps["oai_stream"];
    assert_eq!(s["finish"], "tool_calls", "{s}");
    assert_eq!(s["text"], "Checking.", "{s}");
    assert_eq!(s["calls"][0]["id"], "toolu_oai_stream", "{s}");
    assert_eq!(s["calls"][0]["name"], "get_weather", "{s}");
    let args: Value = serde_json::from_str(s["calls"][0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let s = &steps["ant_stream"];
    assert_eq!(s["stop"], "tool_use", "{s}");
    assert_eq!(s["calls"][0]["input"], json!({"city": "Paris"}), "{s}");

    // Refusals: 400 naming both tools; 400 naming the message of a result for a call the
    // session never made; nothing reached the provider for either.
    let clash = &steps["clash"];
    assert_eq!(clash["status"], 400, "{clash}");
    let message = clash["body"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "client tool `session_status` has the name of agentd's tool `session_status`"
        ),
        "{clash}"
    );
    let unknown = &steps["unknown_call"];
    assert_eq!(unknown["status"], 400, "{unknown}");
    assert_eq!(unknown["body"]["param"], "messages[2]", "{unknown}");
    assert!(
        unknown["body"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("call_never"),
        "{unknown}"
    );
    assert!(!fake.requests().iter().any(|r| {
        let t = last_user_text(r);
        t.ends_with("clash") || t.contains("made up")
    }));

    // agentd's own call ran first (its result is in the provider's next request, beside the
    // client's); the client got only its own call.
    let mixed = &steps["mixed"];
    assert_eq!(mixed["calls"].as_array().map(Vec::len), Some(1), "{mixed}");
    assert_eq!(mixed["calls"][0]["name"], "get_weather", "{mixed}");
    assert_eq!(mixed["final"], "It is 18 C and sunny in Paris.", "{mixed}");
    let next = fake
        .requests()
        .into_iter()
        .find(|r| {
            let last = &r["messages"].as_array().unwrap().last().unwrap()["content"];
            last.to_string().contains("toolu_mixed")
        })
        .expect("the results of the mixed turn reached the provider");
    let last = next["messages"].as_array().unwrap().last().unwrap().clone();
    let ids: Vec<&str> = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["tool_use_id"].as_str())
        .collect();
    assert_eq!(ids, ["toolu_own", "toolu_mixed"], "{last}");
    let own = last["content"][0]["content"].to_string();
    assert!(!own.contains("did not"), "agentd's tool ran: {own}");
    assert!(d.sigterm().success());
}

#[test]
fn a_plain_message_after_a_client_call_closes_it_with_an_error_result() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(responder);
    let (mut d, base) = daemon(&fake, "");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let post = |body: Value| {
        crate::compat::post_json(
            port,
            "/v1/chat/completions",
            &[("X-Agentd-Session", "close")],
            &body,
        )
    };
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let first = post(json!({"model": "agentd", "tools": tools,
        "messages": [{"role": "user", "content": "weather in Paris? (close)"}]}));
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let second = post(json!({"model": "agentd", "tools": tools,
        "messages": [{"role": "user", "content": "never mind"}]}));
    assert_eq!(
        second["choices"][0]["message"]["content"], "plain answer",
        "{second}"
    );
    let request = fake
        .requests()
        .into_iter()
        .find(|r| last_user_text(r).contains("never mind"))
        .expect("the plain message reached the provider");
    let sent = request["messages"].to_string();
    assert!(
        sent.contains("the client did not return a result for this call"),
        "{sent}"
    );
    assert!(d.sigterm().success());
}
