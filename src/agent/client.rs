//! A compatible endpoint's client tools in the loop (SPEC §17). The client defines function
//! tools and runs them itself: they are offered to the model beside the agent's own for that
//! message only; when the model calls one, the agent's own calls of that answer still run,
//! then the turn ends with the client's calls open ([`Finish::Reply`]'s `client_calls`). The
//! client's next request brings their results, recorded as untrusted content before the loop
//! goes on; a plain message instead closes them with an error result, so the history every
//! provider sees stays valid.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::run::Run;
use super::{Agent, Fail, Work};
use crate::config::ModelSpec;
use crate::llm::{ChatResponse, ToolChoice, ToolSpec};
use crate::message::call::ClientToolChoice;
use crate::message::{Message, ToolCall, ToolResult};
use crate::session::{Event, MessageEvent, SessionHandle, SessionState};

/// What the error result of an open client call says when the client's next request did not
/// bring its result.
pub(super) const NO_CLIENT_RESULT: &str = "the client did not return a result for this call";

/// The client tools of one message and the client's `tool_choice`.
#[derive(Debug, Default)]
pub(super) struct ClientTools {
    /// The definitions as tool specs, sorted by name.
    specs: Vec<ToolSpec>,
    choice: Option<ClientToolChoice>,
    /// The last list made by [`ClientTools::tools`] and the agent's list it was made from: the
    /// same `Arc` for every call of the message while the agent's tools stay, so the wire
    /// JSON of the list is made once (`llm::tool_memo`).
    combined: std::sync::Mutex<Option<Combined>>,
}

/// The agent's list and the list with the client's tools made from it.
type Combined = (Arc<[ToolSpec]>, Arc<[ToolSpec]>);

impl ClientTools {
    /// The client tools `work` brings (none for work that is not a compatible request).
    pub(super) fn of(work: &Work) -> ClientTools {
        let Some(api) = work.api() else {
            return ClientTools::default();
        };
        let mut specs: Vec<ToolSpec> = api
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.parameters.clone(),
            })
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        ClientTools {
            specs,
            choice: api.tool_choice.clone(),
            combined: Default::default(),
        }
    }

    /// Whether the model is offered client tools at all (`tool_choice: none` withholds them).
    fn offered(&self) -> bool {
        !self.specs.is_empty() && self.choice != Some(ClientToolChoice::None)
    }

    /// Whether `name` is one of the client's tools offered to the model.
    pub(super) fn has(&self, name: &str) -> bool {
        self.offered() && self.specs.iter().any(|s| s.name == name)
    }

    /// The tool list of a call: the agent's own (`own`, sorted, so the prompt cache keeps
    /// its head), then the client's, sorted.
    pub(super) fn tools(&self, own: Arc<[ToolSpec]>) -> Arc<[ToolSpec]> {
        if !self.offered() {
            return own;
        }
        let mut combined = self.combined.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((from, list)) = combined.as_ref()
            && Arc::ptr_eq(from, &own)
        {
            return list.clone();
        }
        let list: Arc<[ToolSpec]> = own.iter().chain(&self.specs).cloned().collect();
        *combined = Some((own, list.clone()));
        list
    }

    /// The tool choice of a call that is not the last: the client's `required` or named tool
    /// for the first call of the message, else `auto`.
    pub(super) fn choice(&self, first_call: bool) -> ToolChoice {
        match &self.choice {
            Some(ClientToolChoice::Required) if first_call && self.offered() => {
                ToolChoice::Required
            }
            Some(ClientToolChoice::Tool { name }) if first_call && self.has(name) => {
                ToolChoice::Tool(name.clone())
            }
            _ => ToolChoice::Auto,
        }
    }

    /// The ids of the calls in `calls` the client runs: calls of its tools that are not
    /// answered by agentd instead (`refused`: a malformed call).
    pub(super) fn calls_of(&self, calls: &[ToolCall], refused: &[Option<String>]) -> Vec<String> {
        calls
            .iter()
            .enumerate()
            .filter(|(i, c)| self.has(&c.name) && refused.get(*i).is_none_or(Option::is_none))
            .map(|(_, c)| c.id.clone())
            .collect()
    }
}

/// The calls at the end of the history still waiting for a result.
pub(super) use crate::message::open_tool_calls as dangling;

/// The error result of a dangling call: the client's that got no result, or one a stop
/// interrupted.
pub(super) fn dangling_result(call: &ToolCall, client: bool) -> ToolResult {
    ToolResult {
        tool_call_id: call.id.clone(),
        content: if client {
            format!("error: {NO_CLIENT_RESULT} ('{}')", call.name)
        } else {
            format!(
                "error: tool '{}' did not finish: the daemon stopped before its result was recorded",
                call.name
            )
        },
        is_error: true,
        images: Vec::new(),
    }
}

impl Agent {
    /// The end of a turn that called client tools (`client`: their ids): the agent's own
    /// calls of the answer run first, as in any turn (gate, approvals, execution), and their
    /// results are recorded; the client's calls stay open and are returned. An answer without
    /// calls is returned as it is.
    pub(super) async fn run_own_calls(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        (resp, refused, spec): (ChatResponse, &[Option<String>], &ModelSpec),
        client: &[String],
        turn: u32,
    ) -> Result<(ChatResponse, Vec<ToolCall>), Option<Fail>> {
        let (theirs, own): (Vec<_>, Vec<_>) = resp
            .tool_calls
            .iter()
            .cloned()
            .zip(refused.iter().cloned().chain(std::iter::repeat(None)))
            .partition(|(c, _)| client.contains(&c.id));
        if !own.is_empty() {
            let (calls, own_refused): (Vec<ToolCall>, Vec<Option<String>>) =
                own.into_iter().unzip();
            let batch = ChatResponse {
                tool_calls: calls,
                ..resp.clone()
            };
            self.run_tools(run, state, (&batch, &own_refused, spec), turn)
                .await?;
        }
        Ok((resp, theirs.into_iter().map(|(c, _)| c).collect()))
    }

    /// The results a compatible request brings for the session's open client calls, recorded
    /// as the first step of its work (so a restart does not record them twice): in the order
    /// of the calls, each wrapped as untrusted content; a call the request does not answer
    /// gets an error result. Results for calls that are not dangling were refused at intake
    /// (`llm::compat::check_results`); one that slipped through (a race) is dropped.
    pub(super) async fn record_client_results(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        work: &Work,
        cancel: &CancellationToken,
    ) -> Result<(), Option<Fail>> {
        let Some(api) = work.api().filter(|a| !a.tool_results.is_empty()) else {
            return Ok(());
        };
        let open = dangling(&state.messages);
        let results: Vec<ToolResult> = open
            .iter()
            .map(
                |call| match api.tool_results.iter().find(|r| r.tool_call_id == call.id) {
                    Some(r) => ToolResult {
                        tool_call_id: call.id.clone(),
                        content: self.tools.client_result(&call.name, &r.content),
                        is_error: r.is_error,
                        images: Vec::new(),
                    },
                    None => {
                        let client = state.open_client_calls.contains(&call.id)
                            || api.tools.iter().any(|t| t.name == call.name);
                        dangling_result(call, client)
                    }
                },
            )
            .collect();
        let dropped = api
            .tool_results
            .iter()
            .filter(|r| !open.iter().any(|c| c.id == r.tool_call_id))
            .count();
        if dropped > 0 {
            tracing::warn!(session = %session.id, dropped, "client tool results for calls that are not open; dropped");
        }
        if results.is_empty() {
            return Ok(());
        }
        let mut ev = MessageEvent::new(Message::ToolResults {
            results,
            notice: None,
        });
        ev.reply_to = work.ids();
        ev.source = Some(work.source().to_string());
        ev.from = Some(work.from().to_string());
        self.record_durably(session, state, Event::Message(ev), cancel)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: json!({}),
        }
    }

    fn assistant(calls: Vec<ToolCall>) -> Message {
        Message::Assistant {
            text: String::new(),
            tool_calls: calls,
            thinking: vec![],
            usage: None,
        }
    }

    fn results(ids: &[&str]) -> Message {
        Message::ToolResults {
            results: ids
                .iter()
                .map(|id| ToolResult {
                    tool_call_id: id.to_string(),
                    content: "ok".into(),
                    is_error: false,
                    images: Vec::new(),
                })
                .collect(),
            notice: None,
        }
    }

    #[test]
    fn dangling_calls_are_those_of_the_last_calls_without_results() {
        let h = vec![
            Message::user_text("hi"),
            assistant(vec![call("a", "read"), call("c", "lookup")]),
            results(&["a"]),
        ];
        let open: Vec<&str> = dangling(&h).iter().map(|c| c.id.as_str()).collect();
        assert_eq!(open, ["c"]);
        let mut done = h.clone();
        done.push(results(&["c"]));
        assert!(dangling(&done).is_empty());
        let mut talked = h;
        talked.push(Message::user_text("next"));
        assert!(dangling(&talked).is_empty());
    }

    #[test]
    fn the_client_choice_forces_only_the_first_call() {
        let mut tools = ClientTools {
            specs: vec![ToolSpec {
                name: "lookup".into(),
                description: String::new(),
                input_schema: json!({"type": "object"}),
            }],
            choice: Some(ClientToolChoice::Tool {
                name: "lookup".into(),
            }),
            combined: Default::default(),
        };
        assert_eq!(tools.choice(true), ToolChoice::Tool("lookup".into()));
        assert_eq!(tools.choice(false), ToolChoice::Auto);
        tools.choice = Some(ClientToolChoice::Required);
        assert_eq!(tools.choice(true), ToolChoice::Required);
        let own: Arc<[ToolSpec]> = Arc::from(vec![]);
        assert_eq!(tools.tools(own.clone()).len(), 1);
        assert!(
            Arc::ptr_eq(&tools.tools(own.clone()), &tools.tools(own.clone())),
            "one list per message"
        );
        tools.choice = Some(ClientToolChoice::None);
        assert_eq!(
            tools.tools(own).len(),
            0,
            "none withholds the client's tools"
        );
        assert!(!tools.has("lookup"));
        let calls = [call("1", "lookup"), call("2", "read")];
        tools.choice = None;
        assert_eq!(tools.calls_of(&calls, &[None, None]), ["1"]);
        assert!(
            tools
                .calls_of(&calls, &[Some("bad".into()), None])
                .is_empty()
        );
    }
}
