//! The chat commands (SPEC §10.3, §18.2) for every chat channel: `/reset`, `/stop`, `/status`,
//! `/model`, `/skills`, `/skill`. A channel recognises a command with [`parse`], runs it with
//! [`run`] against the daemon's [`SessionControl`] and shows the [`Reply`] its own way: the
//! text, with the buttons when it has them (their data comes back through [`press`]). Which
//! session a chat is, and who may send commands, is the channel's (`allow_from`).

use futures::future::BoxFuture;
use serde::Serialize;

/// A chat command of an allowed user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatCommand {
    /// Archive this chat's session.
    Reset,
    /// Cancel the message in flight.
    Stop,
    /// Report status.
    Status,
    /// `/model` (show the choices) or `/model NAME|default`.
    Model(Option<String>),
    /// `/skills`: the skills with their state in this chat.
    Skills,
    /// `/skill on|off NAME`; `enabled` is none when the arguments are not that.
    Skill { enabled: Option<bool>, name: String },
}

/// The command at the start of `text`, if it is one of ours: `/reset`, `/stop`, `/status`,
/// `/model`, `/skills`, `/skill`, optionally addressed (`/stop@my_bot`) and followed by
/// arguments.
pub fn parse(text: &str) -> Option<ChatCommand> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    let name = first.strip_prefix('/')?;
    let name = name.split_once('@').map_or(name, |(n, _)| n);
    match name.to_ascii_lowercase().as_str() {
        "reset" => Some(ChatCommand::Reset),
        "stop" => Some(ChatCommand::Stop),
        "status" => Some(ChatCommand::Status),
        "model" => Some(ChatCommand::Model(words.next().map(str::to_string))),
        "skills" => Some(ChatCommand::Skills),
        "skill" => {
            let enabled = match words.next().map(str::to_ascii_lowercase).as_deref() {
                Some("on") => Some(true),
                Some("off") => Some(false),
                _ => None,
            };
            let name = words.next().unwrap_or_default().to_string();
            let enabled = enabled.filter(|_| !name.is_empty());
            Some(ChatCommand::Skill { enabled, name })
        }
        _ => None,
    }
}

/// A session setting to change (SPEC §18.2).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Pin this model; `None` = `default`, routing decides again.
    Model(Option<String>),
    /// Turn a skill on or off for the session.
    Skill { name: String, enabled: bool },
}

/// A skill as the session sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkillState {
    pub name: String,
    pub enabled: bool,
    /// Its body is in the prompt (when enabled) rather than only its index line.
    pub always_on: bool,
}

/// A session's settings after a request: the body of the HTTP answers too.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    pub key: String,
    /// None when the key has no session yet (and the request changed nothing).
    pub session_id: Option<String>,
    /// The pinned model; null = routing.
    pub model: Option<String>,
    /// The loaded models a session can be pinned to.
    pub models: Vec<String>,
    pub skills: Vec<SkillState>,
}

/// Why a settings request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    #[error("unknown model {name:?}: the loaded models are {}; or `default` to go back to routing", list(.loaded))]
    UnknownModel { name: String, loaded: Vec<String> },
    #[error("unknown skill {name:?}: the loaded skills are {}", list(.loaded))]
    UnknownSkill { name: String, loaded: Vec<String> },
    #[error("agentd is stopping; nothing was changed, try again after the restart")]
    Stopping,
    #[error("cannot record the change in the session trail: {0}")]
    Failed(String),
}

/// `a, b, c`, or `(none)`.
pub fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_string()
    } else {
        names.join(", ")
    }
}

/// How busy the daemon is, for `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// `[agent] name`.
    pub agent: String,
    pub running: usize,
    pub queued: usize,
}

/// The answer to a settings request, once the session's queue has run it ([`Self::wait`]).
pub struct SettingsAnswer(BoxFuture<'static, Result<Settings, ControlError>>);

impl SettingsAnswer {
    pub fn new(
        answer: impl std::future::Future<Output = Result<Settings, ControlError>> + Send + 'static,
    ) -> SettingsAnswer {
        SettingsAnswer(Box::pin(answer))
    }

    /// Wait for the answer.
    pub async fn wait(self) -> Result<Settings, ControlError> {
        self.0.await
    }
}

/// What the chat commands do, implemented by the daemon (its session queues).
pub trait SessionControl: Send + Sync {
    /// Archive session `key` through its queue (after what is queued before it); how many
    /// sessions that was (0: none).
    fn reset<'a>(&'a self, key: &'a str, reason: &'a str) -> BoxFuture<'a, usize>;
    /// Cancel `key`'s message in flight; whether one was running.
    fn stop(&self, key: &str) -> bool;
    /// How busy the daemon is.
    fn load(&self) -> Load;
    /// Queue a look at `key`'s settings (`change: None`) or a change of them on its queue now,
    /// recorded as made through `channel`; the answer comes once the worker ran it.
    fn settings<'a>(
        &'a self,
        key: &'a str,
        change: Option<Change>,
        channel: &'a str,
    ) -> BoxFuture<'a, SettingsAnswer>;
}

/// A button under an answer: its label, and the data [`press`] takes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub label: String,
    pub data: String,
}

/// A command's answer: `text`, and `buttons` for a channel that shows them (a channel that
/// cannot, or fails to, shows the text alone: it names the typed commands too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub text: String,
    pub buttons: Vec<Button>,
}

impl Reply {
    fn text(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            buttons: Vec::new(),
        }
    }
}

/// The data prefix of the `/model` buttons: `model:NAME`.
pub const MODEL_BUTTON: &str = "model:";

/// The data prefix of the `/skills` buttons: `skill:on:NAME`, `skill:off:NAME`.
pub const SKILL_BUTTON: &str = "skill:";

/// Run `cmd` for session `key`, sent through `channel`. What must stay in order with the
/// chat's next messages (a reset, a stop, queuing a settings change) is done before this
/// returns; the answer resolves later (a settings change waits for the session's queue), so a
/// channel's poller never waits for a message in flight.
pub async fn run(
    control: &dyn SessionControl,
    key: &str,
    channel: &str,
    cmd: ChatCommand,
) -> BoxFuture<'static, Reply> {
    let (change, listing) = match cmd {
        ChatCommand::Reset => {
            let n = control.reset(key, &format!("{channel} /reset")).await;
            let text = if n > 0 {
                "Session reset. The conversation so far is archived."
            } else {
                "There is no session to reset."
            };
            return ready(Reply::text(text));
        }
        ChatCommand::Stop => {
            let text = if control.stop(key) {
                "Stopping the message in flight."
            } else {
                "Nothing is running."
            };
            return ready(Reply::text(text));
        }
        ChatCommand::Status => {
            let l = control.load();
            let text = format!(
                "{}: {} message(s) running, {} queued.",
                l.agent, l.running, l.queued
            );
            return ready(Reply::text(text));
        }
        ChatCommand::Skill { enabled: None, .. } => {
            return ready(Reply::text(
                "Use /skill on NAME or /skill off NAME; /skills lists them.",
            ));
        }
        ChatCommand::Model(None) => (None, Listing::Models),
        ChatCommand::Model(Some(name)) => (Some(Change::Model(Some(name))), Listing::Models),
        ChatCommand::Skills => (None, Listing::Skills),
        ChatCommand::Skill {
            enabled: Some(enabled),
            name,
        } => (Some(Change::Skill { name, enabled }), Listing::Skills),
    };
    let changed = change.is_some();
    let answer = control.settings(key, change, channel).await;
    Box::pin(async move {
        let s = match answer.wait().await {
            Ok(s) => s,
            Err(e) => return Reply::text(e.to_string()),
        };
        match (listing, changed) {
            (Listing::Models, true) => Reply::text(model_changed(&s)),
            (Listing::Models, false) => Reply {
                text: model_text(&s),
                buttons: model_buttons(&s.models),
            },
            (Listing::Skills, true) => Reply::text(skills_text(&s)),
            (Listing::Skills, false) => Reply {
                text: skills_text(&s),
                buttons: skill_buttons(&s),
            },
        }
    })
}

/// A press of a button of [`run`]'s replies (`model:NAME`, `skill:on|off:NAME`) in session
/// `key`'s chat: the change is queued like the command's, and the answer (what changed, or why
/// not) resolves once it is made. `None`: `data` is not such a button.
pub async fn press(
    control: &dyn SessionControl,
    key: &str,
    channel: &str,
    data: &str,
) -> Option<BoxFuture<'static, String>> {
    let change = button_change(data)?;
    let is_model = matches!(change, Change::Model(_));
    let answer = control.settings(key, Some(change), channel).await;
    Some(Box::pin(async move {
        match answer.wait().await {
            Ok(s) if is_model => model_changed(&s),
            Ok(s) => skills_text(&s),
            Err(e) => e.to_string(),
        }
    }))
}

/// The change a button's data asks for.
fn button_change(data: &str) -> Option<Change> {
    if let Some(name) = data.strip_prefix(MODEL_BUTTON) {
        return Some(Change::Model(Some(name.to_string())));
    }
    let (state, name) = data.strip_prefix(SKILL_BUTTON)?.split_once(':')?;
    let enabled = match state {
        "on" => true,
        "off" => false,
        _ => return None,
    };
    Some(Change::Skill {
        name: name.to_string(),
        enabled,
    })
}

fn ready(reply: Reply) -> BoxFuture<'static, Reply> {
    Box::pin(std::future::ready(reply))
}

/// Which settings a command answers with.
#[derive(Clone, Copy)]
enum Listing {
    Models,
    Skills,
}

/// The answer to a model change.
fn model_changed(s: &Settings) -> String {
    match &s.model {
        Some(m) => format!("This chat now uses {m}."),
        None => "This chat's model follows routing again (default).".into(),
    }
}

/// The text of `/model`: the pinned model and the choices.
pub fn model_text(s: &Settings) -> String {
    let current = match &s.model {
        Some(m) => format!("This chat's model is {m} (pinned)."),
        None => "This chat's model follows routing (default).".to_string(),
    };
    format!(
        "{current}\nLoaded models: {}.\nChoose one below, or send /model NAME or /model default.",
        list(&s.models)
    )
}

/// The text of `/skills`: each skill with its state in this chat.
pub fn skills_text(s: &Settings) -> String {
    if s.skills.is_empty() {
        return "No skills are loaded.".to_string();
    }
    let mut out = String::from("Skills in this chat:");
    for k in &s.skills {
        out.push_str(&format!(
            "\n{} {}{}",
            if k.enabled { "on " } else { "off" },
            k.name,
            if k.always_on { " (always on)" } else { "" }
        ));
    }
    out.push_str("\nChange one with /skill on NAME or /skill off NAME.");
    out
}

/// The `/model` buttons: one per loaded model and `default`.
fn model_buttons(models: &[String]) -> Vec<Button> {
    let all = models.iter().map(String::as_str).chain(["default"]);
    all.map(|m| Button {
        label: m.to_string(),
        data: format!("{MODEL_BUTTON}{m}"),
    })
    .collect()
}

/// The `/skills` buttons: per skill, the switch to the other state.
fn skill_buttons(s: &Settings) -> Vec<Button> {
    s.skills
        .iter()
        .map(|k| {
            let (label, to) = match k.enabled {
                true => ("turn off", "off"),
                false => ("turn on", "on"),
            };
            Button {
                label: format!("{label} {}", k.name),
                data: format!("{SKILL_BUTTON}{to}:{}", k.name),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A daemon that records what it was asked.
    #[derive(Default)]
    struct Fake {
        asked: Mutex<Vec<String>>,
    }

    impl SessionControl for Fake {
        fn reset<'a>(&'a self, key: &'a str, reason: &'a str) -> BoxFuture<'a, usize> {
            self.asked
                .lock()
                .unwrap()
                .push(format!("reset {key} {reason}"));
            Box::pin(async { 1 })
        }
        fn stop(&self, key: &str) -> bool {
            self.asked.lock().unwrap().push(format!("stop {key}"));
            false
        }
        fn load(&self) -> Load {
            Load {
                agent: "bot".into(),
                running: 1,
                queued: 2,
            }
        }
        fn settings<'a>(
            &'a self,
            key: &'a str,
            change: Option<Change>,
            channel: &'a str,
        ) -> BoxFuture<'a, SettingsAnswer> {
            self.asked
                .lock()
                .unwrap()
                .push(format!("settings {key} {change:?} {channel}"));
            let model = match &change {
                Some(Change::Model(m)) => m.clone(),
                _ => None,
            };
            let s = Settings {
                key: key.to_string(),
                session_id: None,
                model,
                models: vec!["cheap".into()],
                skills: vec![SkillState {
                    name: "weather".into(),
                    enabled: true,
                    always_on: false,
                }],
            };
            let answer = SettingsAnswer::new(async move { Ok(s) });
            Box::pin(async move { answer })
        }
    }

    #[tokio::test]
    async fn commands_run_against_the_daemon_the_same_for_every_channel() {
        let fake = Fake::default();
        let reset = run(&fake, "Alice", "matrix", ChatCommand::Reset)
            .await
            .await;
        assert!(reset.text.contains("archived"), "{reset:?}");
        let stop = run(&fake, "Alice", "matrix", ChatCommand::Stop).await.await;
        assert_eq!(stop.text, "Nothing is running.");
        let status = run(&fake, "Alice", "matrix", ChatCommand::Status)
            .await
            .await;
        assert_eq!(status.text, "bot: 1 message(s) running, 2 queued.");
        let models = run(&fake, "Alice", "matrix", ChatCommand::Model(None))
            .await
            .await;
        let data: Vec<&str> = models.buttons.iter().map(|b| b.data.as_str()).collect();
        assert_eq!(data, ["model:cheap", "model:default"]);
        let skills = run(&fake, "Alice", "matrix", ChatCommand::Skills)
            .await
            .await;
        assert_eq!(skills.buttons[0].data, "skill:off:weather");
        let pressed = press(&fake, "Alice", "matrix", "model:cheap")
            .await
            .unwrap();
        assert_eq!(pressed.await, "This chat now uses cheap.");
        assert!(press(&fake, "Alice", "matrix", "ap:x:a").await.is_none());
        assert!(
            press(&fake, "Alice", "matrix", "skill:maybe:x")
                .await
                .is_none()
        );
        let asked = fake.asked.lock().unwrap().clone();
        assert_eq!(asked[0], "reset Alice matrix /reset");
        assert!(asked.iter().all(|a| a.contains("Alice")), "{asked:?}");
        assert!(asked.last().unwrap().ends_with("matrix"), "{asked:?}");
    }

    #[test]
    fn skills_text_shows_each_state() {
        let s = Settings {
            key: "alice".into(),
            session_id: None,
            model: None,
            models: vec![],
            skills: vec![
                SkillState {
                    name: "alpha".into(),
                    enabled: true,
                    always_on: true,
                },
                SkillState {
                    name: "beta".into(),
                    enabled: false,
                    always_on: false,
                },
            ],
        };
        let text = skills_text(&s);
        assert!(
            text.contains("off beta") && text.contains("on  alpha (always on)"),
            "{text}"
        );
    }
}
