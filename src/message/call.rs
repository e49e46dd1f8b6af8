//! What a client of the OpenAI- and Anthropic-compatible endpoints (SPEC §17) chose for the
//! model calls of its message, in neutral form. Recorded with the intake (so a message resumed
//! after a restart keeps them) and carried by each `llm::ChatRequest` of that message; the
//! wire renderers apply them within the model's configuration. `CallOptions::default()`
//! changes nothing, and is not written to the trail.

use serde::{Deserialize, Serialize};

/// Per-message call options. Each is validated where the request arrives
/// (`llm::openai::server`, `llm::anthropic::server`); the renderers only apply them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallOptions {
    /// At most the model's configured `max_tokens` (that one stays the ceiling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature. Anthropic only takes it while thinking is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// OpenAI `reasoning_effort`; on Anthropic models with adaptive thinking,
    /// `output_config.effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    /// Anthropic `thinking` as the client asked for it (Anthropic models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ClientThinking>,
    /// Structured output: the final answer must be JSON (OpenAI `response_format`, Anthropic
    /// `output_config.format`). Sent to the provider with every call of the message and
    /// checked on the final answer (`agent::run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: a schema is rare and large, an intake is common.
    pub format: Option<Box<OutputFormat>>,
    /// `Some(false)`: at most one tool call per answer (OpenAI `parallel_tool_calls: false`,
    /// Anthropic `disable_parallel_tool_use: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
}

impl CallOptions {
    /// True when nothing is asked for.
    pub fn is_empty(&self) -> bool {
        *self == CallOptions::default()
    }
}

/// A client's `thinking` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientThinking {
    /// No thinking for this message.
    Disabled,
    /// Thinking with this many budget tokens (at least 1024, below `max_tokens`).
    Enabled { budget_tokens: u32 },
    /// The model decides.
    Adaptive,
}

/// The shape a client asked the final answer to have (SPEC §17 structured output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    /// Any JSON object (OpenAI `json_object`).
    JsonObject,
    /// JSON valid under `schema`, a JSON Schema object.
    JsonSchema {
        /// The format's name (OpenAI requires one; `output` when the API has none).
        name: String,
        schema: serde_json::Value,
        /// OpenAI `strict`, passed on as asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
}

/// A function tool the client of a compatible endpoint defines and runs itself (SPEC §17):
/// offered to the model beside the agent's own tools; a call of it ends the turn and goes
/// back to the client. Checked where the request arrives (`llm::compat::client_tool`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: serde_json::Value,
}

/// The client's `tool_choice` (SPEC §17).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientToolChoice {
    /// The model decides (the default).
    Auto,
    /// The client's tools are not offered for this message (the agent's own stay).
    None,
    /// The first call of the message must call a tool (OpenAI `required`, Anthropic `any`).
    Required,
    /// The first call of the message must call this client tool.
    Tool { name: String },
}

/// The effort values both APIs accept.
pub const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_roundtrip_and_default_is_empty() {
        assert!(CallOptions::default().is_empty());
        let o = CallOptions {
            max_tokens: Some(100),
            temperature: Some(0.5),
            effort: Some("low".into()),
            thinking: Some(ClientThinking::Enabled {
                budget_tokens: 2048,
            }),
            format: None,
            parallel_tool_calls: None,
        };
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(
            s,
            r#"{"max_tokens":100,"temperature":0.5,"effort":"low","thinking":{"type":"enabled","budget_tokens":2048}}"#
        );
        assert_eq!(serde_json::from_str::<CallOptions>(&s).unwrap(), o);
        assert_eq!(
            serde_json::to_string(&CallOptions::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn a_format_roundtrips_in_its_trail_shape() {
        let o = CallOptions {
            format: Some(Box::new(OutputFormat::JsonSchema {
                name: "answer".into(),
                schema: serde_json::json!({"type": "object"}),
                strict: Some(true),
                description: None,
            })),
            ..CallOptions::default()
        };
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(
            s,
            r#"{"format":{"type":"json_schema","name":"answer","schema":{"type":"object"},"strict":true}}"#
        );
        assert_eq!(serde_json::from_str::<CallOptions>(&s).unwrap(), o);
        let o = CallOptions {
            format: Some(Box::new(OutputFormat::JsonObject)),
            ..CallOptions::default()
        };
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(s, r#"{"format":{"type":"json_object"}}"#);
        assert!(!o.is_empty());
    }
}
