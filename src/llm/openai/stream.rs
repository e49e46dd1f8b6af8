//! OpenAI-compatible chat-completions SSE stream → `ChatResponse`. Tolerant of the variations
//! between compatible servers: unknown fields are ignored, nulls where arrays are expected,
//! tool-call deltas without `index` or `id`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::llm::sse::SseHandler;
use crate::llm::{ChatResponse, DeltaSink, LlmError, StopReason, StreamDelta};
use crate::message::{ToolCall, Usage};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// OpenAI usage. `prompt_tokens` includes the cached tokens.
#[derive(Deserialize, Default, Debug, Clone, Copy, PartialEq)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    /// DeepSeek's name for cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize, Default, Debug, Clone, Copy, PartialEq)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    /// agentd's meaning: input = prompt − cached, cache_read = cached (SPEC §4).
    pub(crate) fn to_usage(self) -> Usage {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let cached = self
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .or(self.prompt_cache_hit_tokens)
            .unwrap_or(0)
            .min(prompt);
        Usage {
            input_tokens: prompt - cached,
            output_tokens: self.completion_tokens.unwrap_or(0),
            cache_read_tokens: cached,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct WireError {
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

impl WireError {
    fn describe(&self) -> String {
        self.message
            .clone()
            .or_else(|| self.kind.clone())
            .unwrap_or_else(|| "unknown error".into())
    }

    /// Overload and server errors reported inside a stream are worth another attempt.
    fn retryable(&self) -> bool {
        let code_retryable = match &self.code {
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .is_some_and(|c| matches!(c, 408 | 409 | 429) || (500..=599).contains(&c)),
            Some(serde_json::Value::String(s)) => is_retryable_kind(s),
            _ => false,
        };
        code_retryable || self.kind.as_deref().is_some_and(is_retryable_kind)
    }
}

fn is_retryable_kind(kind: &str) -> bool {
    matches!(
        kind,
        "server_error" | "api_error" | "overloaded_error" | "rate_limit_exceeded" | "timeout"
    )
}

#[derive(Default)]
struct ToolAcc {
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates one streamed chat completion.
pub(crate) struct StreamParser {
    provider: String,
    model: String,
    text: String,
    tools: BTreeMap<u64, ToolAcc>,
    finish_reason: Option<String>,
    usage: Option<WireUsage>,
    saw_content: bool,
    /// Bytes of text, refusal and tool ids, names and arguments.
    content_bytes: usize,
    done: bool,
    /// Text as it arrives, for a streamed answer of a compatible endpoint.
    deltas: Option<DeltaSink>,
    /// Text held back from `deltas` while it may be a tool call written as text.
    hold: Option<crate::llm::textcalls::HoldBack>,
}

impl StreamParser {
    /// Also hand each piece of text to `deltas` as it arrives.
    pub(crate) fn with_deltas(mut self, deltas: Option<DeltaSink>) -> Self {
        self.deltas = deltas;
        self
    }

    /// Hold the text back from the deltas while it may be a tool call written as text
    /// (`tool_calls_in_text`); [`StreamParser::finish_text_calls`] settles it.
    pub(crate) fn holding_back(mut self, hold: bool) -> Self {
        self.hold = hold.then(Default::default);
        self
    }

    /// The response, with tool calls written in its text taken as calls (for one of
    /// `tools`), and the text held back from the deltas sent unless it was calls.
    pub(crate) fn finish_text_calls(mut self, tools: &[crate::llm::ToolSpec]) -> ChatResponse {
        let hold = self.hold.take();
        let deltas = self.deltas.clone();
        let mut resp = self.finish();
        if resp.tool_calls.is_empty()
            && let Some(r) = crate::llm::textcalls::recover(&resp.text, tools)
        {
            resp.text = r.text;
            resp.tool_calls = r.calls;
            if resp.stop_reason == StopReason::EndTurn {
                resp.stop_reason = StopReason::ToolUse;
            }
        }
        if let (Some(mut hold), Some(d)) = (hold, deltas)
            && let Some(text) = hold.finish(!resp.tool_calls.is_empty())
        {
            let _ = d.send(StreamDelta::Text(text));
        }
        resp
    }

    /// `provider` labels errors; `model` is the id reported if the chunks name none.
    pub(crate) fn new(provider: &str, model: &str) -> Self {
        StreamParser {
            provider: provider.to_string(),
            model: model.to_string(),
            text: String::new(),
            tools: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            saw_content: false,
            content_bytes: 0,
            done: false,
            deltas: None,
            hold: None,
        }
    }

    /// The response assembled from everything received.
    pub(crate) fn finish(self) -> ChatResponse {
        let tool_calls = self
            .tools
            .into_iter()
            .map(|(index, acc)| ToolCall {
                id: if acc.id.is_empty() {
                    format!("call_{index}")
                } else {
                    acc.id
                },
                name: acc.name,
                arguments: if acc.arguments.trim().is_empty() {
                    serde_json::json!({})
                } else {
                    crate::llm::parse_tool_arguments(&acc.arguments)
                },
            })
            .collect();
        ChatResponse {
            text: self.text,
            tool_calls,
            thinking: Vec::new(),
            stop_reason: stop_reason(self.finish_reason.as_deref()),
            usage: self.usage.map(WireUsage::to_usage).unwrap_or_default(),
            model: self.model,
        }
    }

    /// The accumulator slot of a tool-call delta. Servers that omit `index` (seen on some
    /// compatible endpoints) are matched by `id`, else continue the latest call.
    fn slot(&mut self, delta: &ToolCallDelta, position: usize) -> u64 {
        if let Some(index) = delta.index {
            return index;
        }
        let next = self.tools.keys().next_back().map_or(0, |k| k + 1);
        match delta.id.as_deref().filter(|id| !id.is_empty()) {
            Some(id) => self
                .tools
                .iter()
                .find(|(_, acc)| acc.id == id)
                .map_or(next.max(position as u64), |(k, _)| *k),
            None => self.tools.keys().next_back().copied().unwrap_or(0),
        }
    }

    fn on_chunk(&mut self, chunk: Chunk) -> Result<(), LlmError> {
        if let Some(error) = chunk.error {
            return Err(LlmError::Stream {
                provider: self.provider.clone(),
                message: error.describe(),
                after_content: self.saw_content,
                retryable: error.retryable(),
            });
        }
        if let Some(model) = chunk.model.filter(|m| !m.is_empty()) {
            self.model = model;
        }
        if let Some(usage) = chunk.usage {
            // Plausible for one call, or the answer is malformed (SPEC §16.9).
            usage
                .to_usage()
                .check_per_call()
                .map_err(|message| LlmError::Decode {
                    provider: self.provider.clone(),
                    message,
                })?;
            self.usage = Some(usage);
        }
        let choices = chunk.choices.unwrap_or_default();
        let Some(choice) = choices.into_iter().find(|c| c.index.unwrap_or(0) == 0) else {
            return Ok(());
        };
        if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
            self.finish_reason = Some(reason);
        }
        let Some(delta) = choice.delta else {
            return Ok(());
        };
        for piece in [delta.content, delta.refusal].into_iter().flatten() {
            if !piece.is_empty() {
                if let Some(d) = &self.deltas {
                    let shown = match &mut self.hold {
                        Some(hold) => hold.push(&piece),
                        None => Some(piece.clone()),
                    };
                    // A receiver that went away (the client hung up) changes nothing.
                    if let Some(shown) = shown {
                        let _ = d.send(StreamDelta::Text(shown));
                    }
                }
                self.text.push_str(&piece);
                self.content_bytes = self.content_bytes.saturating_add(piece.len());
                self.saw_content = true;
            }
        }
        for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let slot = self.slot(&call, position);
            let acc = self.tools.entry(slot).or_default();
            let mut added = 0usize;
            if let Some(id) = call.id.filter(|id| !id.is_empty())
                && acc.id.is_empty()
            {
                added += id.len();
                acc.id = id;
            }
            if let Some(function) = call.function {
                if let Some(name) = function.name.filter(|n| !n.is_empty())
                    && acc.name.is_empty()
                {
                    added += name.len();
                    acc.name = name;
                }
                if let Some(arguments) = function.arguments {
                    added += arguments.len();
                    acc.arguments.push_str(&arguments);
                }
            }
            self.content_bytes = self.content_bytes.saturating_add(added);
            self.saw_content = true;
        }
        Ok(())
    }
}

fn stop_reason(raw: Option<&str>) -> StopReason {
    match raw {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::Refusal,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("unknown".into()),
    }
}

impl SseHandler for StreamParser {
    fn on_event(&mut self, _event: &str, data: &str) -> Result<bool, LlmError> {
        let data = data.trim();
        if self.done || data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| LlmError::Decode {
            provider: self.provider.clone(),
            message: format!("unreadable stream chunk: {e}"),
        })?;
        self.on_chunk(chunk)?;
        Ok(false)
    }

    fn saw_content(&self) -> bool {
        self.saw_content
    }

    fn content_bytes(&self) -> usize {
        self.content_bytes
    }

    /// Some servers close without `[DONE]`; the answer is complete once both the finish reason
    /// and the usage arrived.
    fn accept_eof(&self) -> bool {
        self.finish_reason.is_some() && self.usage.is_some()
    }
}

/// The message of an error body `{"error":{"message"}}` (some servers send a bare string).
pub(crate) fn parse_error_body(body: &str) -> Option<String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ErrorField {
        Object(WireError),
        Text(String),
    }
    #[derive(Deserialize)]
    struct Body {
        error: ErrorField,
    }
    let body: Body = serde_json::from_str(body).ok()?;
    Some(match body.error {
        ErrorField::Object(e) => e.describe(),
        ErrorField::Text(s) => s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::sse::testing::run_split;
    use proptest::prelude::*;
    use serde_json::json;

    const TRANSCRIPT: &str = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        ": keep-alive comment\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"ignored\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Grüße, \"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"world 🌍\"},\"finish_reason\":null}],\"system_fingerprint\":\"fp\"}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"read\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\":\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"exec\",\"arguments\":\"{bad\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"a.txt\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":30,\"total_tokens\":1230,\"prompt_tokens_details\":{\"cached_tokens\":1024,\"audio_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn expected() -> ChatResponse {
        ChatResponse {
            text: "Grüße, world 🌍".into(),
            tool_calls: vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "read".into(),
                    arguments: json!({ "path": "a.txt" }),
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "exec".into(),
                    arguments: json!({ "__invalid_json": "{bad" }),
                },
            ],
            thinking: vec![],
            stop_reason: StopReason::ToolUse,
            usage: Usage {
                input_tokens: 176,
                output_tokens: 30,
                cache_read_tokens: 1024,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            },
            model: "gpt-x".into(),
        }
    }

    async fn parse(transcript: &[u8], cuts: &[usize]) -> Result<ChatResponse, LlmError> {
        let mut p = StreamParser::new("openai (t)", "fallback-id");
        run_split(transcript, cuts, &mut p).await?;
        Ok(p.finish())
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[tokio::test]
    async fn whole_transcript() {
        assert_eq!(parse(TRANSCRIPT.as_bytes(), &[]).await.unwrap(), expected());
    }

    /// A streamed answer of a compatible endpoint gets the text piece by piece, in order, and
    /// the pieces add up to the answer's text.
    #[tokio::test]
    async fn text_pieces_go_to_the_delta_sink_as_they_arrive() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut p = StreamParser::new("openai (t)", "fallback-id").with_deltas(Some(tx));
        run_split(TRANSCRIPT.as_bytes(), &[7, 100], &mut p)
            .await
            .unwrap();
        let answer = p.finish();
        let mut pieces = Vec::new();
        while let Ok(StreamDelta::Text(t)) = rx.try_recv() {
            pieces.push(t);
        }
        assert!(pieces.len() >= 2, "{pieces:?}");
        assert_eq!(pieces.concat(), answer.text);
    }

    proptest! {

        /// A stream a broken server or proxy sends — a field missing or of the wrong type, an
        /// index that points nowhere, an event lost, repeated or out of order — gives an
        /// answer or an `LlmError`, never a panic.
        #[test]
        fn edited_streams_never_panic(edits in crate::proptest_json::stream_edits()) {
            let t = crate::proptest_json::edited_transcript(TRANSCRIPT, &edits);
            let _ = block_on(parse(t.as_bytes(), &[]));
        }

        /// Error bodies are outside input too: any text gives a message or nothing.
        #[test]
        fn error_bodies_never_panic(v in crate::proptest_json::any_json(), text in "\\PC{0,80}") {
            let _ = parse_error_body(&v.to_string());
            let _ = parse_error_body(&serde_json::json!({"error": v}).to_string());
            let _ = parse_error_body(&text);
        }

        #[test]
        fn byte_split_transcript_gives_same_result(cuts in proptest::collection::vec(any::<usize>(), 0..40)) {
            let got = block_on(parse(TRANSCRIPT.as_bytes(), &cuts)).unwrap();
            prop_assert_eq!(got, expected());
        }

        #[test]
        fn crlf_split_transcript_gives_same_result(cuts in proptest::collection::vec(any::<usize>(), 0..20)) {
            let crlf = TRANSCRIPT.replace('\n', "\r\n");
            let got = block_on(parse(crlf.as_bytes(), &cuts)).unwrap();
            prop_assert_eq!(got, expected());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = block_on(parse(&bytes, &[]));
        }
    }

    #[test]
    fn usage_mapping() {
        let u: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 100, "completion_tokens": 7,
            "prompt_tokens_details": { "cached_tokens": 60 }
        }))
        .unwrap();
        assert_eq!(
            u.to_usage(),
            Usage {
                input_tokens: 40,
                output_tokens: 7,
                cache_read_tokens: 60,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            }
        );
        // No details (local servers), null details, DeepSeek naming.
        let u: WireUsage =
            serde_json::from_value(json!({ "prompt_tokens": 10, "completion_tokens": 2 })).unwrap();
        assert_eq!(u.to_usage().input_tokens, 10);
        let u: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": null
        }))
        .unwrap();
        assert_eq!(u.to_usage().cache_read_tokens, 0);
        let u: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 10, "completion_tokens": 2, "prompt_cache_hit_tokens": 4
        }))
        .unwrap();
        assert_eq!(u.to_usage().input_tokens, 6);
        assert_eq!(u.to_usage().prompt_tokens(), 10);
    }

    #[tokio::test]
    async fn finish_reasons() {
        for (raw, want) in [
            ("stop", StopReason::EndTurn),
            ("length", StopReason::MaxTokens),
            ("content_filter", StopReason::Refusal),
            ("weird", StopReason::Other("weird".into())),
        ] {
            let t = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"finish_reason\":\"{raw}\"}}]}}\n\ndata: [DONE]\n\n"
            );
            assert_eq!(parse(t.as_bytes(), &[]).await.unwrap().stop_reason, want);
        }
    }

    #[tokio::test]
    async fn tool_calls_without_index_or_id() {
        let t = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"g1\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},{\"id\":\"g2\",\"function\":{\"name\":\"b\",\"arguments\":\"{\\\"x\\\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"c\",\"arguments\":\"\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let r = parse(t.as_bytes(), &[]).await.unwrap();
        let got: Vec<(String, String, serde_json::Value)> = r
            .tool_calls
            .into_iter()
            .map(|c| (c.id, c.name, c.arguments))
            .collect();
        assert_eq!(
            got,
            vec![
                ("g1".into(), "a".into(), json!({})),
                ("g2".into(), "b".into(), json!({ "x": 1 })),
            ]
        );
        // Index given but never an id: a stable generated id.
        let t = "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"c\"}}]}}]}\n\ndata: [DONE]\n\n";
        let r = parse(t.as_bytes(), &[]).await.unwrap();
        assert_eq!(r.tool_calls[0].id, "call_0");
        assert_eq!(r.tool_calls[0].arguments, json!({}));
    }

    #[tokio::test]
    async fn end_without_done() {
        // Finish reason and usage arrived: accepted.
        let cut = TRANSCRIPT.find("data: [DONE]").unwrap();
        assert_eq!(
            parse(&TRANSCRIPT.as_bytes()[..cut], &[]).await.unwrap(),
            expected()
        );
        // Usage missing: a broken stream after content.
        let cut = TRANSCRIPT
            .find("data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],")
            .unwrap();
        let err = parse(&TRANSCRIPT.as_bytes()[..cut], &[]).await.unwrap_err();
        assert!(matches!(
            err,
            LlmError::Stream {
                after_content: true,
                ..
            }
        ));
    }

    /// Text and tool-call ids, names and arguments count toward the reply size.
    #[tokio::test]
    async fn content_bytes_count_text_and_tool_calls() {
        let t = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abc\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read\",\"arguments\":\"{\\\"p\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let mut p = StreamParser::new("test", "m");
        run_split(t.as_bytes(), &[], &mut p).await.unwrap();
        assert_eq!(
            p.content_bytes(),
            "abc".len() + "c1read".len() + "{\"p\":1}".len()
        );
    }

    /// Usage beyond the per-call cap (issue #12) or negative is a malformed answer.
    #[tokio::test]
    async fn implausible_usage_is_a_malformed_answer() {
        for usage in [
            "{\"prompt_tokens\":18446744073709551615,\"completion_tokens\":1}",
            "{\"prompt_tokens\":1,\"completion_tokens\":10000001}",
            "{\"prompt_tokens\":-1,\"completion_tokens\":1}",
        ] {
            let t = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
                 data: {{\"choices\":[],\"usage\":{usage}}}\n\ndata: [DONE]\n\n"
            );
            let err = parse(t.as_bytes(), &[]).await.unwrap_err();
            assert!(matches!(err, LlmError::Decode { .. }), "{usage}: {err:?}");
        }
        let t = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n\
                 data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10000000,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            parse(t.as_bytes(), &[]).await.unwrap().usage.input_tokens,
            10_000_000
        );
    }

    #[tokio::test]
    async fn error_chunk() {
        let t = "data: {\"error\":{\"message\":\"Provider overloaded\",\"code\":502}}\n\n";
        let err = parse(t.as_bytes(), &[]).await.unwrap_err();
        assert!(err.is_retryable());
        assert!(err.to_string().contains("Provider overloaded"));
        let t = "data: {\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\"}}\n\n";
        assert!(!parse(t.as_bytes(), &[]).await.unwrap_err().is_retryable());
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            parse_error_body(r#"{"error":{"message":"Invalid model","type":"invalid_request_error","code":null}}"#)
                .as_deref(),
            Some("Invalid model")
        );
        assert_eq!(
            parse_error_body(r#"{"error":"model not found"}"#).as_deref(),
            Some("model not found")
        );
        assert_eq!(parse_error_body("Bad Gateway"), None);
    }
}
