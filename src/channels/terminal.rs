//! The terminal channel of `agentd chat` (SPEC §5.1): each stdin line is a message from source
//! `terminal` (session `terminal`), accepted durably like any other; the reply is printed on
//! stdout.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::intake::{Answer, IntakeSink};
use crate::control::Source;
use crate::session::Intake;

/// Read lines until end of input or `stop`.
pub async fn run(intake: Arc<dyn IntakeSink>, stop: CancellationToken) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    let _ = out
        .write_all(b"agentd chat: type a message, Ctrl-D to quit\n> ")
        .await;
    let _ = out.flush().await;
    loop {
        let line = tokio::select! {
            _ = stop.cancelled() => return,
            l = lines.next_line() => match l {
                Ok(Some(l)) => l,
                Ok(None) | Err(_) => return,
            },
        };
        let text = line.trim();
        if text.is_empty() {
            let _ = out.write_all(b"> ").await;
            let _ = out.flush().await;
            continue;
        }
        let intake_item = Intake {
            id: uuid::Uuid::now_v7().to_string(),
            source: Source::Terminal,
            from: "terminal".into(),
            text: text.to_string(),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        };
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            r = intake.ask("terminal", intake_item) => match r {
                Err(e) => format!("[error] {e}"),
                Ok(c) => answer(Answer::of(c.as_ref())),
            },
        };
        let _ = out.write_all(format!("{answer}\n> ").as_bytes()).await;
        let _ = out.flush().await;
    }
}

/// What is printed for an answer.
fn answer(a: Answer) -> String {
    match a {
        Answer::Reply(text) => text,
        Answer::Silent => "(silent reply)".to_string(),
        Answer::Failed(reply) => format!("[error] {reply}"),
        Answer::Interrupted => "[interrupted]".to_string(),
    }
}
