//! Anthropic Messages SSE stream → `ChatResponse`. Unknown events, block types and delta types
//! are ignored so new API features never break parsing.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::llm::sse::SseHandler;
use crate::llm::{ChatResponse, DeltaSink, LlmError, StopReason, StreamDelta};
use crate::message::{ThinkingBlock, ToolCall, Usage};

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessageStart,
    },
    ContentBlockStart {
        index: u64,
        content_block: WireStartBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: WireDelta,
    },
    ContentBlockStop {
        #[allow(dead_code)]
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: Option<WireMessageDelta>,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct WireMessageStart {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireStartBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Default)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Anthropic usage; every field optional (absent or null leaves the value unchanged).
#[derive(Deserialize, Default, Debug, Clone, Copy, PartialEq)]
pub(crate) struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    /// The cache writes by TTL (SPEC §20): `ephemeral_1h_input_tokens` are priced at
    /// `cache_write_1h`.
    #[serde(default)]
    cache_creation: Option<WireCacheCreation>,
}

#[derive(Deserialize, Default, Debug, Clone, Copy, PartialEq)]
pub(crate) struct WireCacheCreation {
    #[serde(default)]
    ephemeral_1h_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Override the fields present here (`message_delta` usage is cumulative). Anthropic's
    /// `input_tokens` already excludes cache reads and writes, as agentd's `Usage` does.
    pub(crate) fn apply(&self, usage: &mut Usage) {
        if let Some(v) = self.input_tokens {
            usage.input_tokens = v;
        }
        if let Some(v) = self.output_tokens {
            usage.output_tokens = v;
        }
        if let Some(v) = self.cache_creation_input_tokens {
            usage.cache_write_tokens = v;
        }
        if let Some(v) = self.cache_read_input_tokens {
            usage.cache_read_tokens = v;
        }
        if let Some(v) = self
            .cache_creation
            .and_then(|c| c.ephemeral_1h_input_tokens)
        {
            usage.cache_write_1h_tokens = v;
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct WireError {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl WireError {
    /// "type: message" as far as known.
    pub(crate) fn describe(&self) -> String {
        match (&self.kind, &self.message) {
            (Some(k), Some(m)) => format!("{k}: {m}"),
            (None, Some(m)) => m.clone(),
            (Some(k), None) => k.clone(),
            (None, None) => "unknown error".into(),
        }
    }
}

/// A content block being accumulated.
enum Block {
    Text(String),
    Tool {
        id: String,
        name: String,
        start_input: Option<Value>,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: Option<String>,
    },
    Redacted(String),
}

/// Accumulates one streamed Messages response.
pub(crate) struct StreamParser {
    provider: String,
    model: String,
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    stop_reason: Option<String>,
    saw_content: bool,
    /// Bytes of text, thinking, signatures, redacted data and tool ids, names and inputs.
    content_bytes: usize,
    done: bool,
    /// Text as it arrives, for a streamed answer of a compatible endpoint.
    deltas: Option<DeltaSink>,
}

impl StreamParser {
    /// Also hand each piece of text to `deltas` as it arrives.
    pub(crate) fn with_deltas(mut self, deltas: Option<DeltaSink>) -> Self {
        self.deltas = deltas;
        self
    }

    /// `provider` labels errors; `model` is the id reported if `message_start` names none.
    pub(crate) fn new(provider: &str, model: &str) -> Self {
        StreamParser {
            provider: provider.to_string(),
            model: model.to_string(),
            blocks: BTreeMap::new(),
            usage: Usage::default(),
            stop_reason: None,
            saw_content: false,
            content_bytes: 0,
            done: false,
            deltas: None,
        }
    }

    /// The response assembled from everything received (blocks in index order).
    pub(crate) fn finish(self) -> ChatResponse {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        let mut thinking = Vec::new();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(t) => text.push_str(&t),
                Block::Tool {
                    id,
                    name,
                    start_input,
                    json,
                } => {
                    let arguments = if json.trim().is_empty() {
                        start_input.unwrap_or_else(|| json!({}))
                    } else {
                        crate::llm::parse_tool_arguments(&json)
                    };
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                Block::Thinking {
                    thinking: t,
                    signature,
                } => thinking.push(ThinkingBlock {
                    thinking: Some(t),
                    signature: signature.filter(|s| !s.is_empty()),
                    redacted_data: None,
                }),
                Block::Redacted(data) => thinking.push(ThinkingBlock {
                    thinking: None,
                    signature: None,
                    redacted_data: Some(data),
                }),
            }
        }
        ChatResponse {
            text,
            tool_calls,
            thinking,
            stop_reason: stop_reason(self.stop_reason.as_deref()),
            usage: self.usage,
            model: self.model,
        }
    }

    /// The usage so far must be plausible for one call (SPEC §16.9); otherwise the answer is
    /// malformed and nothing of it is billed or stored.
    fn check_usage(&self) -> Result<(), LlmError> {
        self.usage
            .check_per_call()
            .map_err(|message| self.decode_error(message))
    }

    fn decode_error(&self, message: String) -> LlmError {
        LlmError::Decode {
            provider: self.provider.clone(),
            message,
        }
    }
}

fn stop_reason(raw: Option<&str>) -> StopReason {
    match raw {
        Some("end_turn") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some("stop_sequence") => StopReason::StopSequence,
        Some("refusal") => StopReason::Refusal,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::Other("unknown".into()),
    }
}

/// Stream `error` event types that are worth another attempt (before content).
fn retryable_error_type(kind: Option<&str>) -> bool {
    matches!(
        kind,
        Some("overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error")
    )
}

impl SseHandler for StreamParser {
    fn on_event(&mut self, _event: &str, data: &str) -> Result<bool, LlmError> {
        if self.done || data.trim().is_empty() {
            return Ok(self.done);
        }
        let event: WireEvent = serde_json::from_str(data)
            .map_err(|e| self.decode_error(format!("unreadable stream event: {e}")))?;
        match event {
            WireEvent::MessageStart { message } => {
                if let Some(model) = message.model.filter(|m| !m.is_empty()) {
                    self.model = model;
                }
                if let Some(usage) = message.usage {
                    usage.apply(&mut self.usage);
                    self.check_usage()?;
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let block = match content_block {
                    WireStartBlock::Text { text } => Block::Text(text),
                    WireStartBlock::ToolUse { id, name, input } => Block::Tool {
                        id,
                        name,
                        start_input: input,
                        json: String::new(),
                    },
                    WireStartBlock::Thinking {
                        thinking,
                        signature,
                    } => Block::Thinking {
                        thinking,
                        signature,
                    },
                    WireStartBlock::RedactedThinking { data } => Block::Redacted(data),
                    WireStartBlock::Unknown => return Ok(false),
                };
                self.content_bytes = self.content_bytes.saturating_add(block_bytes(&block));
                // A block started again at the same index replaces the earlier one.
                if let Some(old) = self.blocks.insert(index, block) {
                    self.content_bytes = self.content_bytes.saturating_sub(block_bytes(&old));
                }
            }
            WireEvent::ContentBlockDelta { index, delta } => {
                let Some(block) = self.blocks.get_mut(&index) else {
                    return Ok(false);
                };
                let added = match (block, delta) {
                    (Block::Text(t), WireDelta::TextDelta { text }) => {
                        t.push_str(&text);
                        if let Some(d) = &self.deltas
                            && !text.is_empty()
                        {
                            // A receiver that went away (the client hung up) changes nothing.
                            let _ = d.send(StreamDelta::Text(text.clone()));
                        }
                        text.len()
                    }
                    (Block::Tool { json, .. }, WireDelta::InputJsonDelta { partial_json }) => {
                        json.push_str(&partial_json);
                        partial_json.len()
                    }
                    (
                        Block::Thinking { thinking, .. },
                        WireDelta::ThinkingDelta { thinking: t },
                    ) => {
                        thinking.push_str(&t);
                        t.len()
                    }
                    (
                        Block::Thinking { signature, .. },
                        WireDelta::SignatureDelta { signature: s },
                    ) => {
                        signature.get_or_insert_with(String::new).push_str(&s);
                        s.len()
                    }
                    _ => return Ok(false),
                };
                self.content_bytes = self.content_bytes.saturating_add(added);
                self.saw_content = true;
            }
            WireEvent::ContentBlockStop { .. } | WireEvent::Ping | WireEvent::Unknown => {}
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    usage.apply(&mut self.usage);
                    self.check_usage()?;
                }
            }
            WireEvent::MessageStop => {
                self.done = true;
                return Ok(true);
            }
            WireEvent::Error { error } => {
                return Err(LlmError::Stream {
                    provider: self.provider.clone(),
                    message: error.describe(),
                    after_content: self.saw_content,
                    retryable: retryable_error_type(error.kind.as_deref()),
                });
            }
        }
        Ok(false)
    }

    fn saw_content(&self) -> bool {
        self.saw_content
    }

    fn content_bytes(&self) -> usize {
        self.content_bytes
    }
}

/// Bytes a block holds when it starts (its initial text, ids, name, input).
fn block_bytes(block: &Block) -> usize {
    match block {
        Block::Text(t) | Block::Redacted(t) => t.len(),
        Block::Tool {
            id,
            name,
            start_input,
            json,
        } => {
            id.len()
                + name.len()
                + json.len()
                + start_input
                    .as_ref()
                    .and_then(|v| serde_json::to_vec(v).ok())
                    .map_or(0, |v| v.len())
        }
        Block::Thinking {
            thinking,
            signature,
        } => thinking.len() + signature.as_ref().map_or(0, String::len),
    }
}

/// The message of an error body `{"type":"error","error":{"type","message"}}`.
pub(crate) fn parse_error_body(body: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        error: WireError,
    }
    let body: Body = serde_json::from_str(body).ok()?;
    Some(body.error.describe())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::sse::testing::run_split;
    use proptest::prelude::*;

    /// A full transcript: thinking with signature, redacted thinking, text in two pieces,
    /// a tool call with split JSON, an unknown block type, an unknown event, pings.
    const TRANSCRIPT: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"think — ünïcode\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIY\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"redacted_thinking\",\"data\":\"ENC\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello, \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"wörld 🌍\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srv\",\"name\":\"web_search\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":3}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":4,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"read\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":4,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\": \\\"a\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":4,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\".txt\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":4}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":5,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"exec\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":5,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"cmd\\\": \"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":5}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":6,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_3\",\"name\":\"noargs\",\"input\":{}}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":6}\n\n",
        "event: brand_new_event\ndata: {\"type\":\"brand_new_event\",\"x\":1}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":87}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    fn expected() -> ChatResponse {
        ChatResponse {
            text: "Hello, wörld 🌍".into(),
            tool_calls: vec![
                ToolCall {
                    id: "toolu_1".into(),
                    name: "read".into(),
                    arguments: json!({ "path": "a.txt" }),
                },
                ToolCall {
                    id: "toolu_2".into(),
                    name: "exec".into(),
                    arguments: json!({ "__invalid_json": "{\"cmd\": " }),
                },
                ToolCall {
                    id: "toolu_3".into(),
                    name: "noargs".into(),
                    arguments: json!({}),
                },
            ],
            thinking: vec![
                ThinkingBlock {
                    thinking: Some("Let me think — ünïcode".into()),
                    signature: Some("EqQBCgIY".into()),
                    redacted_data: None,
                },
                ThinkingBlock {
                    thinking: None,
                    signature: None,
                    redacted_data: Some("ENC".into()),
                },
            ],
            stop_reason: StopReason::ToolUse,
            usage: Usage {
                input_tokens: 12,
                output_tokens: 87,
                cache_read_tokens: 4000,
                cache_write_tokens: 300,
                cache_write_1h_tokens: 0,
            },
            model: "claude-x".into(),
        }
    }

    async fn parse(transcript: &[u8], cuts: &[usize]) -> Result<ChatResponse, LlmError> {
        let mut p = StreamParser::new("anthropic (t)", "fallback-id");
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
        let mut p = StreamParser::new("anthropic (t)", "fallback-id").with_deltas(Some(tx));
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

    #[tokio::test]
    async fn crlf_transcript() {
        let crlf = TRANSCRIPT.replace('\n', "\r\n");
        assert_eq!(parse(crlf.as_bytes(), &[]).await.unwrap(), expected());
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
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = block_on(parse(&bytes, &[]));
        }
    }

    #[tokio::test]
    async fn message_delta_usage_is_cumulative_and_overrides() {
        let t = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":null,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":6,\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":null,\"output_tokens\":40,\"cache_creation\":{\"ephemeral_5m_input_tokens\":1,\"ephemeral_1h_input_tokens\":1}}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let r = parse(t.as_bytes(), &[]).await.unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 6,
                output_tokens: 40,
                cache_read_tokens: 7,
                cache_write_tokens: 2,
                cache_write_1h_tokens: 1,
            }
        );
        assert_eq!(r.stop_reason, StopReason::EndTurn);
        assert_eq!(r.model, "fallback-id");
        assert_eq!(r.usage.prompt_tokens(), 15);
    }

    /// Every kind of content counts toward the reply size: text, thinking, signatures,
    /// redacted data, tool ids, names and inputs.
    #[tokio::test]
    async fn content_bytes_count_every_kind_of_content() {
        let mut p = StreamParser::new("test", "fallback-id");
        run_split(TRANSCRIPT.as_bytes(), &[], &mut p).await.unwrap();
        let r = StreamParser::new("test", "fallback-id");
        assert_eq!(r.content_bytes(), 0);
        // Thinking "Let me think — ünïcode" + signature "EqQBCgIY" + "ENC" + text
        // "Hello, wörld 🌍" + the three tool calls (the unknown server-tool block is dropped and
        // does not count).
        let want = "Let me think — ünïcode".len()
            + "EqQBCgIY".len()
            + "ENC".len()
            + "Hello, wörld 🌍".len()
            + "toolu_1read{}{\"path\": \"a.txt\"}".len()
            + "toolu_2exec{}{\"cmd\": ".len()
            + "toolu_3noargs{}".len();
        assert_eq!(p.content_bytes(), want);
    }

    /// Usage beyond the per-call cap (issue #12: `input_tokens = u64::MAX`) or negative is a
    /// malformed answer, in `message_start` or in `message_delta`.
    #[tokio::test]
    async fn implausible_usage_is_a_malformed_answer() {
        for usage in [
            "{\"input_tokens\":18446744073709551615,\"output_tokens\":1}",
            "{\"input_tokens\":5,\"cache_read_input_tokens\":10000001}",
            "{\"input_tokens\":-5,\"output_tokens\":1}",
        ] {
            for at_start in [true, false] {
                let (start, delta) = if at_start {
                    (usage, "{\"output_tokens\":3}")
                } else {
                    ("{\"input_tokens\":5,\"output_tokens\":1}", usage)
                };
                let t = format!(
                    "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{start}}}}}\n\n\
                     event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
                     event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"hi\"}}}}\n\n\
                     event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{delta}}}\n\n\
                     event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
                );
                let err = parse(t.as_bytes(), &[]).await.unwrap_err();
                assert!(
                    matches!(err, LlmError::Decode { .. }),
                    "{usage} at_start={at_start}: {err:?}"
                );
                assert!(!err.is_retryable());
            }
        }
        // At the cap: accepted.
        let t = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10000000,\"output_tokens\":1}}}\n\n\
                 event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(
            parse(t.as_bytes(), &[]).await.unwrap().usage.input_tokens,
            10_000_000
        );
    }

    #[tokio::test]
    async fn overloaded_error_event_before_content_is_retryable() {
        let t = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: error\n",
            "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        );
        let err = parse(t.as_bytes(), &[]).await.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert!(err.to_string().contains("overloaded_error: Overloaded"));
    }

    #[tokio::test]
    async fn error_event_after_content_is_not_retryable() {
        let t = concat!(
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
            "event: error\n",
            "data: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n",
        );
        let err = parse(t.as_bytes(), &[]).await.unwrap_err();
        assert!(matches!(
            err,
            LlmError::Stream {
                after_content: true,
                ..
            }
        ));
        assert!(!err.is_retryable());

        let t = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"no\"}}\n\n";
        assert!(!parse(t.as_bytes(), &[]).await.unwrap_err().is_retryable());
    }

    #[tokio::test]
    async fn truncated_stream_reports_after_content() {
        let cut = TRANSCRIPT.find("event: message_stop").unwrap();
        let err = parse(&TRANSCRIPT.as_bytes()[..cut], &[]).await.unwrap_err();
        assert!(matches!(
            err,
            LlmError::Stream {
                after_content: true,
                ..
            }
        ));
        let cut = TRANSCRIPT.find("event: ping").unwrap();
        let err = parse(&TRANSCRIPT.as_bytes()[..cut], &[]).await.unwrap_err();
        assert!(err.is_retryable());
    }

    #[tokio::test]
    async fn malformed_json_event_is_a_decode_error() {
        let err = parse(b"event: message_start\ndata: {nope\n\n", &[])
            .await
            .unwrap_err();
        assert!(matches!(err, LlmError::Decode { .. }));
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            parse_error_body(
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}"#
            )
            .as_deref(),
            Some("invalid_request_error: max_tokens: too big")
        );
        assert_eq!(parse_error_body("<html>bad gateway</html>"), None);
    }
}
