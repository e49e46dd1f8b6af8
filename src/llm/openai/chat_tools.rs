//! The client tools of a Chat Completions request (SPEC §17): `tools` (function tools) and
//! `tool_choice` in OpenAI's shapes, checked into the neutral types.

use serde_json::{Map, Value};

use crate::llm::compat::{self, Invalid, short};
use crate::message::call::{ClientTool, ClientToolChoice};

/// `tools`: function tools only (a `custom` tool or another type is refused naming it).
pub(super) fn client_tools(o: &Map<String, Value>) -> Result<Vec<ClientTool>, Invalid> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(Invalid::new("tools", "`tools` must be an array")),
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    format!(
                        "only tools of type \"function\" are supported, got {}",
                        short(other.unwrap_or("none"))
                    ),
                ));
            }
        }
        let Some(f) = t.get("function").filter(|f| f.is_object()) else {
            return Err(Invalid::new(
                format!("{at}.function"),
                "a function tool needs a `function` object",
            ));
        };
        if f.get("strict")
            .is_some_and(|s| !s.is_null() && !s.is_boolean())
        {
            return Err(Invalid::new(
                format!("{at}.function.strict"),
                "`strict` must be true or false",
            ));
        }
        tools.push(compat::client_tool(
            &format!("{at}.function"),
            f.get("name"),
            f.get("description"),
            f.get("parameters"),
            "parameters",
        )?);
    }
    compat::check_client_tools(&tools, "tools")?;
    Ok(tools)
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function":
/// {"name": …}}`.
pub(super) fn tool_choice(o: &Map<String, Value>) -> Result<Option<ClientToolChoice>, Invalid> {
    let named = |v: &Value| {
        (v.get("type").and_then(Value::as_str) == Some("function"))
            .then(|| v.get("function")?.get("name")?.as_str())
            .flatten()
            .map(str::to_string)
    };
    match o.get("tool_choice") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(c)) if c == "none" => Ok(Some(ClientToolChoice::None)),
        Some(Value::String(c)) if c == "auto" => Ok(Some(ClientToolChoice::Auto)),
        Some(Value::String(c)) if c == "required" => Ok(Some(ClientToolChoice::Required)),
        Some(v) => match named(v) {
            Some(name) => Ok(Some(ClientToolChoice::Tool { name })),
            None => Err(Invalid::new(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {}",
                    short(&v.to_string())
                ),
            )),
        },
    }
}
