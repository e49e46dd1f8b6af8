//! Speech to text for inbound audio (SPEC §19): every audio attachment of a message, from
//! Telegram, HTTP or the FIFO, is transcribed before the message is recorded, so the
//! transcript is part of the intake record (the acknowledgement, SPEC §5.2). A crash during
//! the transcription leaves nothing recorded: the source offers the message again (Telegram's
//! offset was not confirmed) and it is transcribed then, once. A message already recorded is
//! never transcribed again (`SessionStore::has_intake`).
//!
//! Before the provider is called: the file's length is established from the file itself
//! (`llm::audio_length`: OGG/Opus page by page, MP3 frame by frame, WAV by its data), audio
//! longer than `[voice] max_audio_seconds` or of no established length is refused. The call goes
//! through the provider gateway (`Gateway::transcribe`): the budget is checked first, as for
//! every provider call, and the bill is the larger of that length and the one the provider
//! reports.
//!
//! Failure, a refusal, or no `[voice] stt_model` keeps the placeholder naming the saved file,
//! so the message still goes through.

use std::path::Path;
use std::sync::Arc;

use crate::config::VoiceConfig;
use crate::gateway::{Bill, CallError, Gateway, Transcribed};
use crate::llm::audio::{AudioFile, duration_label};
use crate::llm::audio_length::{self, Measured};
use crate::session::Intake;

/// The MIME type of an audio file, by its extension (what the transcription endpoints accept).
pub fn audio_mime(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "ogg" | "oga" | "opus" => "audio/ogg",
        "mp3" | "mpga" | "mpeg" => "audio/mpeg",
        "m4a" | "mp4" => "audio/mp4",
        "wav" => "audio/wav",
        "webm" => "audio/webm",
        "flac" => "audio/flac",
        _ => return None,
    })
}

/// An audio file transcribed: what the message text shows, and the transcript alone (echoed in
/// Telegram).
#[derive(Debug, Clone, PartialEq)]
pub struct Heard {
    pub line: String,
    pub transcript: String,
}

/// Transcribes inbound audio with `[voice] stt_model`.
pub struct Transcriber {
    pub gateway: Arc<Gateway>,
    pub cfg: VoiceConfig,
}

impl Transcriber {
    /// Transcribe every audio attachment of `intake` and put the result into its text: the
    /// text sent along first, then one `[voice note m:ss] transcript` line per file. An audio
    /// file that is not transcribed gets a placeholder line naming it and why. Returns the
    /// transcripts. `session_id`: what the cost rows are billed to.
    pub async fn apply(&self, session_id: &str, intake: &mut Intake) -> Vec<Heard> {
        let mut heard = Vec::new();
        let mut lines = Vec::new();
        for shown in &intake.attachments {
            let path = Path::new(shown);
            let Some(mime) = audio_mime(path) else {
                continue;
            };
            match self.transcribe_file(session_id, path, mime).await {
                Ok(h) => {
                    lines.push(h.line.clone());
                    heard.push(h);
                }
                Err(why) => {
                    tracing::warn!(id = %intake.id, file = %shown, error = %why, "audio not transcribed; the message keeps its placeholder");
                    lines.push(format!("[voice note saved as {shown}; {why}]"));
                }
            }
        }
        if !lines.is_empty() {
            let user = intake.text.trim_end();
            let mut text = String::new();
            if !user.is_empty() {
                text.push_str(user);
                text.push('\n');
            }
            text.push_str(&lines.join("\n"));
            intake.text = text;
        }
        heard
    }

    async fn transcribe_file(
        &self,
        session_id: &str,
        path: &Path,
        mime: &str,
    ) -> Result<Heard, String> {
        let Some(model) = &self.cfg.stt_model else {
            return Err("no transcription is configured".into());
        };
        let (bytes, measured) = read_and_measure(path, self.cfg.max_audio_bytes).await?;
        let limit = self.cfg.max_audio_seconds as f64;
        if measured.seconds > limit {
            return Err(format!(
                "not transcribed: it plays {:.0} s, longer than [voice] max_audio_seconds ({})",
                measured.seconds, self.cfg.max_audio_seconds
            ));
        }
        let audio = AudioFile {
            bytes: bytes.into(),
            file_name: upload_name(path, mime, &measured),
            mime: measured.container.mime().to_string(),
        };
        // At intake, outside any message: refused by a spent budget, nothing is sent or billed.
        // Billed by the longer of the two counts: the file's own, and the provider's.
        let bill = Bill::outside(session_id);
        let Transcribed { text, seconds } = match (self.gateway)
            .transcribe(bill, model, &audio, measured.seconds)
            .await
        {
            Ok(paid) => paid.out,
            Err(CallError::Budget(e)) => return Err(format!("not transcribed: {e}")),
            Err(e) => return Err(format!("transcription failed: {e}")),
        };
        if seconds > limit {
            return Err(format!(
                "transcript not used: the transcription server counted {seconds:.0} s, longer than [voice] max_audio_seconds ({})",
                self.cfg.max_audio_seconds
            ));
        }
        let transcript = if text.is_empty() {
            "(no speech recognised)".to_string()
        } else {
            text
        };
        Ok(Heard {
            line: format!("{} {transcript}", duration_label(seconds)),
            transcript,
        })
    }
}

/// The name the upload carries: the saved file's, unless its extension names another
/// container than the bytes are (then the bytes' extension), since servers pick their
/// decoder by it.
fn upload_name(path: &Path, mime: &str, measured: &Measured) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("audio");
    if mime == measured.container.mime() {
        return name.to_string();
    }
    let stem = path.file_stem().and_then(|n| n.to_str()).unwrap_or("audio");
    format!("{stem}.{}", measured.container.extension())
}

/// The file at `path`, at most `max` bytes (larger is refused, naming the key), and its
/// measured length; on the blocking pool, since a large file is read and walked whole.
async fn read_and_measure(path: &Path, max: u64) -> Result<(Vec<u8>, Measured), String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let bytes = read_bounded(&path, max)?;
        let measured =
            audio_length::measure(&bytes).map_err(|e| format!("not transcribed: {e}"))?;
        Ok((bytes, measured))
    })
    .await
    .map_err(|e| format!("cannot read the audio file: {e}"))?
}

/// The file at `path`, at most `max` bytes (larger is refused, naming the key).
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read the audio file: {e}"))?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the audio file: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "not transcribed: the file is larger than [voice] max_audio_bytes ({max})"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upload_is_named_for_its_bytes() {
        let ogg = Measured {
            container: audio_length::Container::OggOpus,
            seconds: 1.0,
        };
        let p = Path::new("/inbox/1-a.oga");
        assert_eq!(upload_name(p, "audio/ogg", &ogg), "1-a.oga");
        let p = Path::new("/inbox/1-a.mp3");
        assert_eq!(upload_name(p, "audio/mpeg", &ogg), "1-a.ogg");
    }

    #[test]
    fn audio_is_recognised_by_extension() {
        assert_eq!(audio_mime(Path::new("/x/1-a.oga")), Some("audio/ogg"));
        assert_eq!(audio_mime(Path::new("n.MP3")), Some("audio/mpeg"));
        assert_eq!(audio_mime(Path::new("n.wav")), Some("audio/wav"));
        assert_eq!(audio_mime(Path::new("n.png")), None);
        assert_eq!(audio_mime(Path::new("noext")), None);
    }
}
