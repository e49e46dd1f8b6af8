//! Per-session settings (SPEC §18.2): the model pinned for a session and the skills turned off
//! for it. Every front end (the chat commands `/model` and `/skill` of `channels::commands`,
//! `POST /api/v1/sessions/{key}/model` and `/skills`, the FIFO lines of `agent-send --session
//! KEY --model|--skill`) hands a [`Request`] to `Dispatcher::session_control`, which queues it
//! as a `Job::Control` on the session's own queue: the worker checks it, appends the
//! `session_model` / `session_skill` trail event and folds it into the state it holds, so the
//! change is ordered with the session's messages and survives a restart whatever the snapshot
//! cadence. The checks and the answer are the pure functions here; the types every front end
//! shares are `channels::commands`'.

use tokio::sync::oneshot;

pub use crate::channels::commands::{Change, ControlError, Settings, SkillState};
use crate::session::event::{SessionModelEvent, SessionSkillEvent};
use crate::session::{Event, SessionState};

/// Longest skill or model name accepted from outside (both are config or directory names).
pub const MAX_NAME_LEN: usize = 128;

/// A change (or, with `change: None`, a look at the settings) for one session key.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub change: Option<Change>,
    /// Where it came from: a chat channel's name (`telegram`), `http`, `fifo` (recorded in
    /// the event).
    pub channel: String,
    /// The request's id (a FIFO line's), recorded so `agent-send` can find the event.
    pub id: Option<String>,
}

/// A queued request and where its answer goes.
#[derive(Debug)]
pub struct Control {
    pub request: Request,
    pub done: oneshot::Sender<Result<Settings, ControlError>>,
}

/// A loaded skill, as the runner reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillInfo {
    pub name: String,
    pub always_on: bool,
}

/// `NAME` or `default` (also `null` from HTTP) → the model to pin, checked against the loaded
/// models.
pub fn check_model(loaded: &[String], name: Option<&str>) -> Result<Option<String>, ControlError> {
    let Some(name) = name.map(str::trim) else {
        return Ok(None);
    };
    if name.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    if name.len() <= MAX_NAME_LEN && loaded.iter().any(|m| m == name) {
        return Ok(Some(name.to_string()));
    }
    Err(ControlError::UnknownModel {
        name: crate::control::escaped_preview(name),
        loaded: loaded.to_vec(),
    })
}

/// A skill name checked against the loaded skills.
pub fn check_skill(skills: &[SkillInfo], name: &str) -> Result<String, ControlError> {
    let name = name.trim();
    if name.len() <= MAX_NAME_LEN && skills.iter().any(|s| s.name == name) {
        return Ok(name.to_string());
    }
    Err(ControlError::UnknownSkill {
        name: crate::control::escaped_preview(name),
        loaded: skills.iter().map(|s| s.name.clone()).collect(),
    })
}

/// Check `change` (names against what is loaded) and turn it into its trail event.
pub fn event_for(
    models: &[String],
    skills: &[SkillInfo],
    change: &Change,
    channel: &str,
    id: Option<String>,
) -> Result<Event, ControlError> {
    Ok(match change {
        Change::Model(name) => Event::SessionModel(SessionModelEvent {
            model: check_model(models, name.as_deref())?,
            channel: channel.to_string(),
            id,
        }),
        Change::Skill { name, enabled } => Event::SessionSkill(SessionSkillEvent {
            name: check_skill(skills, name)?,
            enabled: *enabled,
            channel: channel.to_string(),
            id,
        }),
    })
}

/// The settings of `key` as `state` holds them (none: a key without a session yet).
pub fn settings(
    key: &str,
    state: Option<&SessionState>,
    models: &[String],
    skills: &[SkillInfo],
) -> Settings {
    Settings {
        key: key.to_string(),
        session_id: state.map(|s| s.id.clone()),
        model: state.and_then(|s| s.pinned_model.clone()),
        models: models.to_vec(),
        skills: skills
            .iter()
            .map(|s| SkillState {
                name: s.name.clone(),
                enabled: state.is_none_or(|st| !st.skills_off.contains(&s.name)),
                always_on: s.always_on,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skills() -> Vec<SkillInfo> {
        vec![
            SkillInfo {
                name: "alpha".into(),
                always_on: true,
            },
            SkillInfo {
                name: "beta".into(),
                always_on: false,
            },
        ]
    }

    #[test]
    fn default_routes_and_unknown_models_are_refused_with_the_list() {
        let loaded = vec!["cheap".to_string(), "primary".to_string()];
        assert_eq!(
            check_model(&loaded, Some("cheap")).unwrap().as_deref(),
            Some("cheap")
        );
        assert_eq!(check_model(&loaded, Some("Default")).unwrap(), None);
        assert_eq!(check_model(&loaded, None).unwrap(), None);
        let e = check_model(&loaded, Some("gpt-9")).unwrap_err().to_string();
        assert!(
            e.contains("\"gpt-9\"") && e.contains("cheap, primary") && e.contains("default"),
            "{e}"
        );
    }

    #[test]
    fn unknown_skill_names_the_loaded_ones() {
        assert_eq!(check_skill(&skills(), " beta ").unwrap(), "beta");
        let e = check_skill(&skills(), "gamma").unwrap_err().to_string();
        assert!(e.contains("\"gamma\"") && e.contains("alpha, beta"), "{e}");
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(check_skill(&skills(), &long).is_err());
    }

    #[test]
    fn settings_fold_the_state() {
        let models = vec!["cheap".to_string(), "primary".to_string()];
        let mut st = SessionState::new("s1", "alice", "primary", 0);
        st.skills_off.insert("beta".into());
        st.pinned_model = Some("primary".into());
        let s = settings("alice", Some(&st), &models, &skills());
        assert_eq!(s.model.as_deref(), Some("primary"));
        assert!(s.skills[0].enabled && !s.skills[1].enabled);
        let fresh = settings("bob", None, &models, &skills());
        assert!(fresh.session_id.is_none() && fresh.skills.iter().all(|k| k.enabled));
    }
}
