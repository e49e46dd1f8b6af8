//! `[voice]` (SPEC §19): the speech-to-text and text-to-speech models, the reply mode and the
//! bounds on audio from outside.

use super::keys::state::{
    DEFAULT_OPENAI_VOICE, ECHO_TRANSCRIPT, MAX_AUDIO_BYTES, MAX_AUDIO_SECONDS, MAX_TTS_CHARS,
    REPLY, STT_MODEL, TTS_MODEL, VOICE_NAME,
};
use super::providers::ModelCollector;
use super::types::{ProviderKind, VoiceConfig, VoiceReply};
use super::walker::Section;

/// `[voice]`. `stt_model` and `tts_model` must name defined models; `reply` other than
/// `"off"` needs `tts_model`.
pub fn voice(root: &mut Section<'_>, models: &ModelCollector<'_>) -> VoiceConfig {
    let mut s = root.section("voice");
    let stt_model = s.read(&STT_MODEL);
    let tts_model = s.read(&TTS_MODEL);
    for (key, name) in [("stt_model", &stt_model), ("tts_model", &tts_model)] {
        if let Some(name) = name
            && !models.is_defined(name)
        {
            s.problem(
                key,
                format!(
                    "no model named {name:?} is defined; define [models.{name}] (an OpenAI-compatible provider serving /audio/...) or remove the key"
                ),
            );
        }
    }
    // ElevenLabs is wired for speech only; a transcription model must be OpenAI-compatible.
    if let Some(name) = &stt_model
        && models.kind_of(name) == Some(ProviderKind::ElevenLabs)
    {
        s.problem(
            "stt_model",
            format!(
                "{name:?} is an ElevenLabs model, which agentd uses for speech only; name a model of an OpenAI-compatible /audio/transcriptions server"
            ),
        );
    }
    let reply = s.read(&REPLY);
    if reply != VoiceReply::Off && tts_model.is_none() {
        s.problem(
            "reply",
            format!(
                "{:?} needs tts_model; set [voice] tts_model to a speech model or reply = \"off\"",
                reply.as_str()
            ),
        );
    }
    let given = s.has("voice");
    let voice = s.read_opt(&VOICE_NAME);
    if let Some(voice) = &voice
        && (voice.len() > 64 || voice.chars().any(char::is_control))
    {
        s.problem(
            "voice",
            format!("{voice:?} is not a voice name; use the provider's name, e.g. \"alloy\""),
        );
    }
    let tts_kind = tts_model.as_deref().and_then(|name| models.kind_of(name));
    if !given
        && tts_kind == Some(ProviderKind::ElevenLabs)
        && let Some(name) = &tts_model
    {
        s.problem("voice", elevenlabs_needs_a_voice(name));
    }
    let voice = voice.unwrap_or_else(|| DEFAULT_OPENAI_VOICE.to_string());
    VoiceConfig {
        stt_model,
        tts_model,
        reply,
        echo_transcript: s.read(&ECHO_TRANSCRIPT),
        voice,
        max_audio_bytes: s.read(&MAX_AUDIO_BYTES),
        max_audio_seconds: s.read(&MAX_AUDIO_SECONDS),
        max_tts_chars: s.read(&MAX_TTS_CHARS),
    }
}

/// SPEC §19: an ElevenLabs `tts_model` has no default voice ("alloy" is an OpenAI name, and
/// every synthesis with it fails); the problem names the model, the missing key and the fix.
fn elevenlabs_needs_a_voice(tts_model: &str) -> String {
    format!(
        "not set, and tts_model {tts_model:?} is an ElevenLabs model, which needs a voice id; set [voice] voice = \"<voice id>\" (ElevenLabs: Voices, a voice, \"ID\", e.g. \"JBFqnCBsd6RMkjVDRZzb\")"
    )
}
