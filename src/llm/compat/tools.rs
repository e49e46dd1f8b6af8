//! A compatible endpoint's client tools (SPEC §17), the neutral half: each definition checked
//! (name, description and schema bounds), the tool choice against the definitions, a name
//! clash with agentd's own tools, the tool calls and results of a client's conversation (the
//! history must pair each call with its result; the new input may be results), and the
//! results checked against the calls still open.

use serde_json::Value;

use super::{CompatAttachment, Invalid, short};
use crate::message::call::{ClientTool, ClientToolChoice};
use crate::message::{Message, ToolCall, ToolResult};

/// A result of a client tool in the new input, with where it was in the request (a result
/// that answers no open call is refused naming it).
#[derive(Debug, Clone, PartialEq)]
pub struct CompatToolResult {
    /// The message (and block) it came in, like `messages[4]`.
    pub at: String,
    pub result: ToolResult,
}

/// The most function tools one request may define.
pub const MAX_CLIENT_TOOLS: usize = 128;

/// One client tool definition checked (SPEC §17): a name both providers accept
/// (`^[A-Za-z0-9_-]{1,64}$`), a description and a schema within the bounds every tool from
/// outside has (`llm::schema`), the schema an object schema (`{"type": "object"}` when absent).
/// `at` is where the definition is (`tools[2].function`), `schema_field` its schema's name.
pub fn client_tool(
    at: &str,
    name: Option<&Value>,
    description: Option<&Value>,
    schema: Option<&Value>,
    schema_field: &str,
) -> Result<ClientTool, Invalid> {
    use crate::llm::schema::{MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES};
    let name = match name {
        Some(Value::String(n)) if crate::message::toolcalls::is_valid_token(n) => n.clone(),
        other => {
            return Err(Invalid::new(
                format!("{at}.name"),
                format!(
                    "a tool name must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got {}",
                    short(&other.map(Value::to_string).unwrap_or_else(|| "none".into()))
                ),
            ));
        }
    };
    let description = match description {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(d)) if d.len() <= MAX_DESCRIPTION_BYTES => d.clone(),
        Some(Value::String(_)) => {
            return Err(Invalid::new(
                format!("{at}.description"),
                format!(
                    "the description of tool `{name}` is over {MAX_DESCRIPTION_BYTES} bytes; shorten it"
                ),
            ));
        }
        Some(_) => {
            return Err(Invalid::new(
                format!("{at}.description"),
                "`description` must be a string",
            ));
        }
    };
    let here = format!("{at}.{schema_field}");
    let mut schema = match schema {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => {
            return Err(Invalid::new(
                here,
                format!("the schema of tool `{name}` must be a JSON Schema object"),
            ));
        }
    };
    match schema.get("type") {
        None => {
            schema.insert("type".into(), Value::String("object".into()));
        }
        Some(t) if t == "object" => {}
        Some(_) => {
            return Err(Invalid::new(
                here,
                format!(
                    "the schema of tool `{name}` must have \"type\": \"object\" (the arguments are an object)"
                ),
            ));
        }
    }
    let parameters = Value::Object(schema);
    if parameters.to_string().len() > MAX_SCHEMA_BYTES {
        return Err(Invalid::new(
            here,
            format!("the schema of tool `{name}` is over {MAX_SCHEMA_BYTES} bytes; simplify it"),
        ));
    }
    Ok(ClientTool {
        name,
        description,
        parameters,
    })
}

/// Refuses more than [`MAX_CLIENT_TOOLS`] tools, and two tools of one name.
pub fn check_client_tools(tools: &[ClientTool], field: &str) -> Result<(), Invalid> {
    if tools.len() > MAX_CLIENT_TOOLS {
        return Err(Invalid::new(
            field,
            format!(
                "at most {MAX_CLIENT_TOOLS} tools per request, got {}",
                tools.len()
            ),
        ));
    }
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(Invalid::new(
                format!("{field}[{i}]"),
                format!(
                    "two tools are named `{}`; tool names must be distinct",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a `tool_choice` naming a tool the request does not define.
pub fn check_tool_choice(
    choice: Option<&ClientToolChoice>,
    tools: &[ClientTool],
    field: &str,
) -> Result<(), Invalid> {
    match choice {
        Some(ClientToolChoice::Tool { name }) if !tools.iter().any(|t| &t.name == name) => {
            Err(Invalid::new(
                field,
                format!(
                    "`{field}` names the tool `{}`, which `tools` does not define",
                    short(name)
                ),
            ))
        }
        Some(ClientToolChoice::Required | ClientToolChoice::Tool { .. }) if tools.is_empty() => {
            Err(Invalid::new(
                field,
                format!("`{field}` asks for a tool call, but `tools` defines none"),
            ))
        }
        _ => Ok(()),
    }
}

/// Refuses a client tool named like one of agentd's own tools offered in the session
/// (`own`): the model could not tell them apart.
pub fn check_clash(tools: &[ClientTool], own: &[String]) -> Result<(), Invalid> {
    for (i, t) in tools.iter().enumerate() {
        if let Some(o) = own.iter().find(|o| **o == t.name) {
            return Err(Invalid::new(
                format!("tools[{i}]"),
                format!(
                    "client tool `{}` has the name of agentd's tool `{o}`; rename the client tool",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// The ids of the calls at the end of `history` still waiting for a result
/// ([`crate::message::open_tool_calls`]).
pub fn open_calls(history: &[Message]) -> Vec<String> {
    (crate::message::open_tool_calls(history).into_iter())
        .map(|c| c.id.clone())
        .collect()
}

/// Refuses a result that answers none of the `open` calls, or one answered twice: "a result
/// for a call that was not made in that session is a 400" (SPEC §17). `whose` names where the
/// calls were made, for the message.
pub fn check_results(
    results: &[CompatToolResult],
    open: &[String],
    whose: &str,
) -> Result<(), Invalid> {
    for (i, r) in results.iter().enumerate() {
        let id = &r.result.tool_call_id;
        if results[..i].iter().any(|o| &o.result.tool_call_id == id) {
            return Err(Invalid::new(
                &r.at,
                format!("two results for the tool call `{}`", short(id)),
            ));
        }
        if !open.contains(id) {
            return Err(Invalid::new(
                &r.at,
                format!(
                    "a result for the tool call `{}`, which is not a call waiting for a result in {whose}{}",
                    short(id),
                    if open.is_empty() {
                        String::new()
                    } else {
                        format!(" (waiting: {})", open.join(", "))
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a history whose tool results do not follow the calls they answer (providers
/// refuse it too): a result for a call the assistant message before it did not make, or a
/// call left without a result before the conversation goes on.
pub fn check_history(history: &[Message]) -> Result<(), Invalid> {
    let bad = |m: String| Invalid::new("messages", m);
    let mut open: Vec<&str> = Vec::new();
    for m in history {
        match m {
            Message::Assistant { tool_calls, .. } => {
                if let Some(id) = open.first() {
                    return Err(bad(format!(
                        "the tool call `{}` has no result before the next assistant message",
                        short(id)
                    )));
                }
                open = tool_calls.iter().map(|c| c.id.as_str()).collect();
            }
            Message::ToolResults { results, .. } => {
                for r in results {
                    let Some(at) = open.iter().position(|o| *o == r.tool_call_id) else {
                        return Err(bad(format!(
                            "a tool result for `{}`, which the assistant message before it did not call",
                            short(&r.tool_call_id)
                        )));
                    };
                    open.remove(at);
                }
            }
            Message::User { .. } => {
                if let Some(id) = open.first() {
                    return Err(bad(format!(
                        "the tool call `{}` has no result before the next user message",
                        short(id)
                    )));
                }
            }
        }
    }
    Ok(())
}

/// A tool call of the client's history: its arguments must be a JSON object (OpenAI sends
/// them as a JSON string).
pub fn history_call(id: &str, name: &str, arguments: Value, at: &str) -> Result<ToolCall, Invalid> {
    if !crate::message::toolcalls::is_valid_token(id) {
        return Err(Invalid::new(
            at,
            format!(
                "a tool call id must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-', got {:?}",
                short(id)
            ),
        ));
    }
    if !arguments.is_object() {
        return Err(Invalid::new(
            at,
            "the arguments of a tool call must be a JSON object",
        ));
    }
    Ok(ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments,
    })
}

/// A turn of a client's conversation as parsed: the message, the images and sounds of a
/// user message, and for tool results where each result was in the request.
pub struct Turn {
    pub message: Message,
    pub files: Vec<CompatAttachment>,
    pub at: Vec<String>,
}

impl Turn {
    pub fn of(message: Message) -> Turn {
        Turn {
            message,
            files: Vec::new(),
            at: Vec::new(),
        }
    }
}

/// Adds a tool result to the conversation: to the results just before it, else as a new turn.
pub fn push_result(turns: &mut Vec<Turn>, result: ToolResult, at: String) {
    if let Some(Turn {
        message: Message::ToolResults { results, .. },
        at: ats,
        ..
    }) = turns.last_mut()
    {
        results.push(result);
        ats.push(at);
        return;
    }
    turns.push(Turn {
        message: Message::ToolResults {
            results: vec![result],
            notice: None,
        },
        files: Vec::new(),
        at: vec![at],
    });
}

/// What is new in a request: the last user message's text and files, and the tool results
/// just before it (or the tool results alone, when the conversation ends with them).
pub struct NewInput {
    pub text: String,
    pub attachments: Vec<CompatAttachment>,
    pub tool_results: Vec<CompatToolResult>,
}

/// Takes the new input off the end of `turns` (the conversation of `count` messages); what
/// is left is the history. `last_wrong` says why a conversation may not end with an
/// assistant message.
pub fn new_input(
    turns: &mut Vec<Turn>,
    count: usize,
    last_wrong: &str,
) -> Result<NewInput, Invalid> {
    let mut input = NewInput {
        text: String::new(),
        attachments: Vec::new(),
        tool_results: Vec::new(),
    };
    let mut user = false;
    if let Some(Turn {
        message: Message::User { .. },
        ..
    }) = turns.last()
        && let Some(Turn {
            message: Message::User { content },
            files,
            ..
        }) = turns.pop()
    {
        user = true;
        // The first block is the text; the rest are the attachments' placeholders.
        if let Some(crate::message::UserBlock::Text { text }) = content.into_iter().next() {
            input.text = text;
        }
        input.attachments = files;
    }
    if let Some(Turn {
        message: Message::ToolResults { .. },
        ..
    }) = turns.last()
        && let Some(Turn {
            message: Message::ToolResults { results, .. },
            at,
            ..
        }) = turns.pop()
    {
        input.tool_results = results
            .into_iter()
            .zip(at)
            .map(|(result, at)| CompatToolResult { at, result })
            .collect();
    }
    if !user && input.tool_results.is_empty() {
        return Err(Invalid::new("messages", last_wrong));
    }
    if input.text.trim().is_empty() && input.attachments.is_empty() && input.tool_results.is_empty()
    {
        return Err(Invalid::new(
            format!("messages[{}].content", count.saturating_sub(1)),
            "the last user message is empty",
        ));
    }
    Ok(input)
}
