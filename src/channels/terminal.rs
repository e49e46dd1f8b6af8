//! The terminal channel of `agentd chat` (SPEC §5.1): each stdin line is a message from source
//! `terminal` (session `terminal`), accepted durably like any other; the reply is printed on
//! stdout.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::intake::{IntakeSink, reply_text};
use crate::agent::Finish;
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
        };
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            r = intake.ask("terminal", intake_item) => match r {
                Err(e) => format!("[error] {e}"),
                Ok(c) => answer(c.map(|c| c.finish)),
            },
        };
        let _ = out.write_all(format!("{answer}\n> ").as_bytes()).await;
        let _ = out.flush().await;
    }
}

/// What is printed for a finished message (`None`: the daemon stopped first).
fn answer(finish: Option<Finish>) -> String {
    let Some(finish) = finish else {
        return "[interrupted]".to_string();
    };
    match (reply_text(&finish), &finish) {
        (Some(text), Finish::Failed { .. }) => format!("[error] {text}"),
        (Some(text), _) => text.to_string(),
        (None, Finish::Reply { .. }) => "(silent reply)".to_string(),
        (None, _) => "[interrupted]".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_silence_failure_and_interruption() {
        let reply = |text: &str, silent| Finish::Reply {
            text: text.into(),
            silent,
            usage: Default::default(),
            cost_usd: 0.0,
        };
        assert_eq!(answer(Some(reply("hi", false))), "hi");
        assert_eq!(answer(Some(reply("NO_REPLY", true))), "(silent reply)");
        let failed = Finish::Failed {
            reply: "sorry".into(),
            error: "boom".into(),
        };
        assert_eq!(answer(Some(failed)), "[error] sorry");
        assert_eq!(answer(Some(Finish::Cancelled)), "[interrupted]");
        assert_eq!(answer(None), "[interrupted]");
    }
}
