//! `[voice]` (SPEC §19): the speech-to-text and text-to-speech models, the reply mode and the
//! bounds on audio from outside.

use super::providers::ModelCollector;
use super::types::{ProviderKind, VoiceConfig, VoiceReply};
use super::walker::Section;

/// Largest `max_audio_bytes`: OpenAI's transcription endpoint takes at most 25 MB, and the file
/// is held in memory while it is sent.
pub const MAX_AUDIO_BYTES_CEILING: u64 = 100 << 20;
/// Largest `max_tts_chars` (a request's text is held in memory and billed per character).
pub const MAX_TTS_CHARS_CEILING: usize = 100_000;

/// `[voice]`. `stt_model` and `tts_model` must name defined models; `reply` other than
/// `"off"` needs `tts_model`.
pub fn voice(root: &mut Section<'_>, models: &ModelCollector<'_>) -> VoiceConfig {
    let mut s = root.section("voice");
    let d = VoiceConfig::default();
    let stt_model = s.non_empty("stt_model");
    let tts_model = s.non_empty("tts_model");
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
    let reply = s
        .choice(
            "reply",
            &[
                ("off", VoiceReply::Off),
                ("mirror", VoiceReply::Mirror),
                ("always", VoiceReply::Always),
            ],
        )
        .unwrap_or(d.reply);
    if reply != VoiceReply::Off && tts_model.is_none() {
        s.problem(
            "reply",
            format!(
                "{:?} needs tts_model; set [voice] tts_model to a speech model or reply = \"off\"",
                reply.as_str()
            ),
        );
    }
    let voice = s.non_empty("voice").unwrap_or(d.voice);
    if voice.len() > 64 || voice.chars().any(char::is_control) {
        s.problem(
            "voice",
            format!("{voice:?} is not a voice name; use the provider's name, e.g. \"alloy\""),
        );
    }
    let max_audio_bytes: u64 = s.int("max_audio_bytes", 1024).unwrap_or(d.max_audio_bytes);
    if max_audio_bytes > MAX_AUDIO_BYTES_CEILING {
        s.problem(
            "max_audio_bytes",
            format!(
                "{max_audio_bytes} is above the ceiling of {MAX_AUDIO_BYTES_CEILING}; lower it (OpenAI accepts 25 MB)"
            ),
        );
    }
    let max_tts_chars: usize = s.int("max_tts_chars", 1).unwrap_or(d.max_tts_chars);
    if max_tts_chars > MAX_TTS_CHARS_CEILING {
        s.problem(
            "max_tts_chars",
            format!(
                "{max_tts_chars} is above the ceiling of {MAX_TTS_CHARS_CEILING}; lower it (OpenAI accepts 4096)"
            ),
        );
    }
    VoiceConfig {
        stt_model,
        tts_model,
        reply,
        echo_transcript: s.get("echo_transcript").unwrap_or(d.echo_transcript),
        voice,
        max_audio_bytes,
        max_audio_seconds: s.int("max_audio_seconds", 1).unwrap_or(d.max_audio_seconds),
        max_tts_chars,
    }
}
