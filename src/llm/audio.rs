//! Speech to text and text to speech over OpenAI-compatible endpoints (SPEC §19):
//! `POST {base_url}/audio/transcriptions` (multipart `file` + `model`) and
//! `POST {base_url}/audio/speech` (JSON `model`, `input`, `voice`, `response_format: "opus"`).
//! Each call is bounded like a chat call (inactivity timeout, total deadline) and its answer
//! in size; retries follow the chat rules ([`super::Llm`]'s `with_retries`, SPEC §6).
//! No codec here: speech must come back as OGG/Opus (what Telegram plays as a voice note), an
//! answer in another container is refused naming the fix.

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;

use super::http::{self, CallCtx};
use super::{CallLimits, LlmError};
use crate::config::{ModelSpec, ProviderKind};

/// Most bytes of a transcription answer read (the text of a long recording fits easily).
pub const MAX_TRANSCRIPT_ANSWER: usize = 1 << 20;
/// Most characters of a transcript kept (longer is cut, with an ellipsis).
pub const MAX_TRANSCRIPT_CHARS: usize = 20_000;

/// An audio file to transcribe.
#[derive(Debug, Clone)]
pub struct AudioFile {
    pub bytes: bytes::Bytes,
    /// The name sent with the upload (servers pick the decoder from its extension).
    pub file_name: String,
    pub mime: String,
}

/// What a transcription answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    pub text: String,
    /// Seconds of audio, when the answer says (`duration`: `verbose_json` and some local
    /// servers; `usage.seconds`: OpenAI's duration-billed models).
    pub seconds: Option<f64>,
}

#[derive(Deserialize)]
struct TranscriptAnswer {
    text: String,
    /// `verbose_json` and some local servers.
    #[serde(default)]
    duration: Option<f64>,
    /// OpenAI's models billed by duration: `{"type": "duration", "seconds": …}`.
    #[serde(default)]
    usage: Option<TranscriptUsage>,
}

#[derive(Deserialize)]
struct TranscriptUsage {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    seconds: Option<f64>,
}

impl TranscriptAnswer {
    /// The longest plausible duration the answer reports, if any.
    fn seconds(&self) -> Option<f64> {
        let usage = (self.usage.as_ref())
            .filter(|u| u.kind.as_deref() == Some("duration"))
            .and_then(|u| u.seconds);
        [self.duration, usage]
            .into_iter()
            .flatten()
            .filter(|d| d.is_finite() && *d >= 0.0 && *d < 1e7)
            .reduce(f64::max)
    }
}

/// Speech as a provider returned it.
#[derive(Debug, Clone)]
pub struct Speech {
    /// OGG/Opus bytes.
    pub bytes: Vec<u8>,
}

fn ctx<'a>(spec: &'a ModelSpec, label: &'a str, limits: CallLimits) -> CallCtx<'a> {
    CallCtx {
        label,
        limits,
        secret: spec.api_key.as_ref(),
        parse_error: super::openai::parse_error_body,
    }
}

fn authorised(
    spec: &ModelSpec,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::RequestBuilder, LlmError> {
    Ok(match &spec.api_key {
        Some(key) => request.header(AUTHORIZATION, http::secret_header(spec, "Bearer ", key)?),
        None => request,
    })
}

/// One transcription request (no retry: the caller's `with_retries` repeats it). Private to
/// `llm`: the one way to it is `gateway::Gateway::transcribe`.
pub(super) async fn transcribe(
    http_client: &reqwest::Client,
    spec: &ModelSpec,
    limits: CallLimits,
    audio: &AudioFile,
) -> Result<Transcript, LlmError> {
    let label = http::label(spec);
    let ctx = ctx(spec, &label, limits);
    let part = reqwest::multipart::Part::stream(audio.bytes.clone())
        .file_name(audio.file_name.clone())
        .mime_str(&audio.mime)
        .map_err(|e| LlmError::Decode {
            provider: label.clone(),
            message: format!("the audio's MIME type {:?} is not valid: {e}", audio.mime),
        })?;
    let form = reqwest::multipart::Form::new()
        .part("file", part)
        .text("model", spec.model.clone())
        .text("response_format", "json");
    let request = http_client
        .post(format!("{}/audio/transcriptions", spec.base_url))
        .header(ACCEPT, "application/json")
        .multipart(form);
    let request = authorised(spec, request)?;
    let body = bounded_call(request, &ctx, MAX_TRANSCRIPT_ANSWER, "transcription").await?;
    let answer: TranscriptAnswer = serde_json::from_slice(&body).map_err(|e| LlmError::Decode {
        provider: label.clone(),
        message: format!("the transcription answer is not the expected JSON: {e}"),
    })?;
    Ok(Transcript {
        seconds: answer.seconds(),
        text: http::truncate_chars(answer.text.trim(), MAX_TRANSCRIPT_CHARS),
    })
}

/// One speech request for `text` in `voice` (no retry here either). The answer must be an OGG
/// stream of at most `max_bytes`. Private to `llm`: the one way to it is `gateway::Gateway::speak`.
pub(super) async fn speak(
    http_client: &reqwest::Client,
    spec: &ModelSpec,
    limits: CallLimits,
    text: &str,
    voice: &str,
    max_bytes: usize,
) -> Result<Speech, LlmError> {
    let label = http::label(spec);
    let ctx = ctx(spec, &label, limits);
    let request = match spec.kind {
        ProviderKind::ElevenLabs => elevenlabs_request(http_client, spec, &label, text, voice)?,
        _ => {
            let body = serde_json::json!({
                "model": spec.model,
                "input": text,
                "voice": voice,
                "response_format": "opus",
            });
            let request = http_client
                .post(format!("{}/audio/speech", spec.base_url))
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "audio/ogg, audio/opus, */*")
                .body(body.to_string());
            authorised(spec, request)?
        }
    };
    let bytes = bounded_call(request, &ctx, max_bytes, "speech").await?;
    check_ogg(&bytes).map_err(|message| LlmError::Decode {
        provider: label.clone(),
        message,
    })?;
    Ok(Speech { bytes })
}

/// ElevenLabs' OGG/Opus output format (48 kHz, 64 kbit/s), asked for in the query.
pub const ELEVENLABS_OUTPUT_FORMAT: &str = "opus_48000_64";

/// `POST {base_url}/text-to-speech/{voice id}?output_format=opus_48000_64` with the key in
/// `xi-api-key` and `{text, model_id}`: ElevenLabs' own API (SPEC §19). The voice is a path
/// segment (escaped by the URL builder).
fn elevenlabs_request(
    http_client: &reqwest::Client,
    spec: &ModelSpec,
    label: &str,
    text: &str,
    voice: &str,
) -> Result<reqwest::RequestBuilder, LlmError> {
    let mut url = reqwest::Url::parse(&spec.base_url).map_err(|e| LlmError::Decode {
        provider: label.to_string(),
        message: format!("base_url is not a URL: {e}"),
    })?;
    url.path_segments_mut()
        .map_err(|_| LlmError::Decode {
            provider: label.to_string(),
            message: "base_url cannot take a path".into(),
        })?
        .pop_if_empty()
        .extend(["text-to-speech", voice]);
    url.query_pairs_mut()
        .append_pair("output_format", ELEVENLABS_OUTPUT_FORMAT);
    let body = serde_json::json!({ "text": text, "model_id": spec.model });
    let mut request = http_client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "audio/ogg, audio/opus, */*")
        .body(body.to_string());
    if let Some(key) = &spec.api_key {
        request = request.header("xi-api-key", http::secret_header(spec, "", key)?);
    }
    Ok(request)
}

/// Whether `bytes` are an OGG stream (what Telegram plays as a voice note); the error names
/// what they look like instead and the fix.
pub fn check_ogg(bytes: &[u8]) -> Result<(), String> {
    if bytes.starts_with(b"OggS") {
        return Ok(());
    }
    let looks = if bytes.starts_with(b"ID3") || bytes.starts_with(&[0xFF, 0xFB]) {
        "MP3"
    } else if bytes.starts_with(b"RIFF") {
        "WAV"
    } else if bytes.starts_with(b"fLaC") {
        "FLAC"
    } else if bytes.is_empty() {
        "empty"
    } else {
        "not OGG"
    };
    Err(format!(
        "the speech answer is {looks} audio, not OGG/Opus; Telegram plays only OGG/Opus as a \
         voice note and agentd does not convert audio: use a provider that honours \
         response_format \"opus\" (docs/usage.md, Voice)"
    ))
}

/// Send `request` and read its whole answer, at most `max` bytes, within the call's deadline
/// (the head and each chunk within the inactivity timeout).
async fn bounded_call(
    request: reqwest::RequestBuilder,
    ctx: &CallCtx<'_>,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, LlmError> {
    let deadline = ctx.limits.deadline;
    let too_large = |max| {
        format!("the {what} answer is larger than {max} bytes; refused ([voice] max_audio_bytes)")
    };
    tokio::time::timeout(deadline, http::read_whole(request, ctx, max, &too_large))
        .await
        .unwrap_or_else(|_| {
            Err(LlmError::Deadline {
                provider: ctx.label.to_string(),
                seconds: deadline.as_secs(),
                after_content: false,
            })
        })
}

/// `[voice note m:ss]` for `seconds` (rounded to the nearest second).
pub fn duration_label(seconds: f64) -> String {
    let total = if seconds.is_finite() && seconds > 0.0 {
        seconds.round() as u64
    } else {
        0
    };
    format!("[voice note {}:{:02}]", total / 60, total % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &[u8] = include_bytes!("../../tests/fixtures/voice-hello.ogg");

    #[test]
    fn labels_and_refusals() {
        assert_eq!(duration_label(0.0), "[voice note 0:00]");
        assert_eq!(duration_label(2.822), "[voice note 0:03]");
        assert_eq!(duration_label(12.4), "[voice note 0:12]");
        assert_eq!(duration_label(61.0), "[voice note 1:01]");
        assert_eq!(duration_label(f64::NAN), "[voice note 0:00]");
        assert!(check_ogg(FIXTURE).is_ok());
        let mp3 = check_ogg(b"ID3\x04rest").unwrap_err();
        assert!(
            mp3.contains("MP3") && mp3.contains("response_format"),
            "{mp3}"
        );
        assert!(check_ogg(b"RIFF....WAVE").unwrap_err().contains("WAV"));
    }

    #[test]
    fn the_answer_reports_its_longest_duration() {
        let parse = |s: &str| {
            serde_json::from_str::<TranscriptAnswer>(s)
                .unwrap()
                .seconds()
        };
        assert_eq!(parse(r#"{"text": "x"}"#), None);
        assert_eq!(parse(r#"{"text": "x", "duration": 3.5}"#), Some(3.5));
        assert_eq!(
            parse(r#"{"text": "x", "usage": {"type": "duration", "seconds": 9}}"#),
            Some(9.0)
        );
        assert_eq!(
            parse(r#"{"text": "x", "duration": 12, "usage": {"type": "duration", "seconds": 9}}"#),
            Some(12.0)
        );
        assert_eq!(
            parse(r#"{"text": "x", "usage": {"type": "tokens", "input_tokens": 9}}"#),
            None
        );
        assert_eq!(parse(r#"{"text": "x", "duration": -1}"#), None);
        assert_eq!(parse(r#"{"text": "x", "duration": 1e12}"#), None);
    }
}
