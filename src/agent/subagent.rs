//! Sub-agents (`sessions_spawn`, SPEC §11) through the agent's own loop: the task's prompt as
//! the only user message, a fixed system prompt, the tools of the task's scope, its model, and
//! the `subagent` cost kind, billed to the session of the tool call. The conversation lives in
//! memory only; nothing goes to a trail.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::run::{Caller, Run};
use super::{Agent, FailCause, Finish};
use crate::llm::{SystemBlock, SystemTier};
use crate::message::Message;
use crate::session::SessionState;
use crate::tools::ToolContext;
use crate::tools::spawn::{SubAgentError, SubAgentTask, SubAgents};

/// The sub-agent's whole system prompt.
pub const SUBAGENT_PROMPT: &str = "You are a sub-agent working for the main agent. Do the task below with the tools you have, then answer with a concise result. Your answer is returned to the main agent, not to a person.";

impl Agent {
    /// Run `task` to its final answer in the context of `parent`, the `sessions_spawn` call.
    async fn run_subagent(
        &self,
        task: SubAgentTask,
        parent: &ToolContext,
    ) -> Result<String, SubAgentError> {
        let system = vec![SystemBlock {
            tier: SystemTier::Stable,
            text: SUBAGENT_PROMPT.into(),
        }];
        let mut state = SessionState::new(
            &format!("{}-sub", parent.session_id),
            &parent.session_key,
            &task.model,
            chrono::Utc::now().timestamp(),
        );
        state.messages.push(Message::user_text(task.prompt));
        // Never cancelled: the tool's timeout, or the parent's cancellation, drops the run.
        let cancel = CancellationToken::new();
        let run = Run {
            caller: Caller::SubAgent {
                parent,
                scope: &task.scope,
                system,
            },
            model: &task.model,
            max_turns: task.max_turns.max(1),
            cancel: &cancel,
            options: &Default::default(),
            deltas: None,
            client: &Default::default(),
        };
        match self.run_loop(&run, &mut state).await {
            Ok(Finish::Reply { text, .. }) => Ok(text),
            Ok(other) => Err(SubAgentError::Failed(format!(
                "sub-agent ended without an answer: {other:?}"
            ))),
            Err(None) => Err(SubAgentError::Failed("sub-agent cancelled".into())),
            Err(Some(fail)) => Err(match fail.cause {
                FailCause::Budget => SubAgentError::Budget(fail.error),
                FailCause::Model => SubAgentError::Model(fail.error),
                FailCause::Other => SubAgentError::Failed(fail.error),
            }),
        }
    }
}

impl SubAgents for Agent {
    fn run<'a>(
        &'a self,
        task: SubAgentTask,
        parent: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, SubAgentError>> {
        Box::pin(self.run_subagent(task, parent))
    }
}
