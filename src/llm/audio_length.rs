//! How long an audio file plays, established from the file itself (SPEC §19), before it is
//! sent for transcription: the length is what `[voice] max_audio_seconds` is checked against
//! and what the transcription is billed by (with the provider's own figure, when it reports
//! a larger one). The sender writes every byte of the file, so no single header field is
//! believed:
//!
//! - **OGG/Opus** (Telegram voice notes): every page is walked from the first byte to the
//!   last — capture pattern, version, flags, one logical stream with consecutive page
//!   numbers, segment table, body, and Ogg's CRC-32 (polynomial 0x04C11DB7, not zlib's) —
//!   and every packet is read: `OpusHead` (its pre-skip), `OpusTags`, then each audio packet's
//!   TOC byte, which fixes how many samples the decoder makes of it (RFC 6716 §3.1). The
//!   length is the larger of the last granule position (less the pre-skip, at 48 kHz) and the
//!   packets' sum less the pre-skip and the longest end trim (120 ms): a granule that
//!   understates cannot shorten the audio the decoder plays.
//! - **MP3**: an ID3v2 tag, then MPEG audio frames back to back to the end (an ID3v1 tag and a
//!   cut last frame allowed); each frame header gives its length and samples.
//! - **WAV** (PCM, float, A-law, μ-law): the RIFF chunks; the `data` bytes over the block size
//!   and the sample rate, which is what a decoder plays.
//!
//! Anything else — another container (FLAC, M4A, WebM), another codec in Ogg, bytes that are
//! no audio at all, a page or frame out of place — has no established length and is refused
//! ([`Unmeasured`]): no byte size bounds the length of compressed audio (silence costs a few
//! bytes a second), so there is no honest upper bound to bill instead.

/// An audio container agentd can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    OggOpus,
    Mp3,
    Wav,
}

impl Container {
    /// The MIME type sent with the upload.
    pub fn mime(self) -> &'static str {
        match self {
            Container::OggOpus => "audio/ogg",
            Container::Mp3 => "audio/mpeg",
            Container::Wav => "audio/wav",
        }
    }

    /// The file extension servers pick their decoder by.
    pub fn extension(self) -> &'static str {
        match self {
            Container::OggOpus => "ogg",
            Container::Mp3 => "mp3",
            Container::Wav => "wav",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Container::OggOpus => "OGG/Opus",
            Container::Mp3 => "MP3",
            Container::Wav => "WAV",
        }
    }
}

/// An audio file measured: what it is and how many seconds it plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub container: Container,
    pub seconds: f64,
}

/// Why an audio file's length could not be established; such a file is not sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unmeasured {
    #[error(
        "the file is {looks}, not audio whose length agentd can read; send OGG/Opus (a voice note), MP3 or WAV"
    )]
    NotSupported { looks: &'static str },
    #[error(
        "the {container} file is damaged or inconsistent ({why}), so its length cannot be established"
    )]
    Inconsistent {
        container: &'static str,
        why: String,
    },
}

fn bad(container: Container, why: impl Into<String>) -> Unmeasured {
    Unmeasured::Inconsistent {
        container: container.name(),
        why: why.into(),
    }
}

/// What `bytes` are and how long they play (see the module documentation for the rules).
pub fn measure(bytes: &[u8]) -> Result<Measured, Unmeasured> {
    let not = |looks| Err(Unmeasured::NotSupported { looks });
    if bytes.starts_with(b"OggS") {
        return ogg_opus(bytes);
    }
    if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WAVE") {
        return wav(bytes);
    }
    if bytes.starts_with(b"ID3") || mpeg_header(bytes).is_some() {
        return mp3(bytes);
    }
    match bytes {
        [] => not("empty"),
        [b'f', b'L', b'a', b'C', ..] => not("FLAC audio"),
        [0x1A, 0x45, 0xDF, 0xA3, ..] => not("WebM/Matroska"),
        [_, _, _, _, b'f', b't', b'y', b'p', ..] => not("M4A/MP4"),
        [0x89, b'P', b'N', b'G', ..] => not("a PNG image"),
        [0xFF, 0xD8, 0xFF, ..] => not("a JPEG image"),
        [b'G', b'I', b'F', b'8', ..] => not("a GIF image"),
        [b'%', b'P', b'D', b'F', ..] => not("a PDF document"),
        _ => not("of an unknown kind"),
    }
}

// ---- OGG/Opus ------------------------------------------------------------------------------

/// Ogg's CRC-32 lookup table: polynomial 0x04C11DB7, most significant bit first.
const OGG_CRC: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut r = (i as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            r = if r & 0x8000_0000 != 0 {
                (r << 1) ^ 0x04C1_1DB7
            } else {
                r << 1
            };
            bit += 1;
        }
        table[i] = r;
        i += 1;
    }
    table
};

fn ogg_crc(crc: u32, bytes: &[u8]) -> u32 {
    bytes.iter().fold(crc, |crc, &b| {
        (crc << 8) ^ OGG_CRC[((crc >> 24) as u8 ^ b) as usize]
    })
}

/// The longest Opus packet, in 48 kHz samples (120 ms): also the most a stream's end may trim.
const MAX_PACKET_SAMPLES: u64 = 5760;

/// Samples (48 kHz) an Opus packet decodes to, from its TOC byte and frame count (RFC 6716
/// §3.1); `None` for a packet no decoder accepts. `first`: its first bytes, `len`: its length.
/// An empty packet counts as the longest one.
fn opus_packet_samples(first: &[u8], len: usize) -> Option<u64> {
    let Some(&toc) = first.first() else {
        return (len == 0).then_some(MAX_PACKET_SAMPLES);
    };
    let config = usize::from(toc >> 3);
    let frame: u64 = match config {
        0..=11 => [480, 960, 1920, 2880][config % 4],
        12..=15 => [480, 960][config % 2],
        _ => [120, 240, 480, 960][config % 4],
    };
    let frames = match toc & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => u64::from(*first.get(1)? & 0x3F),
    };
    let samples = frame * frames;
    (frames > 0 && samples <= MAX_PACKET_SAMPLES).then_some(samples)
}

/// The packet being read across segments (and pages): its length and first bytes.
#[derive(Default)]
struct Packet {
    len: usize,
    head: Vec<u8>,
}

/// What the packets of an Opus stream said so far.
#[derive(Default)]
struct OpusPackets {
    count: u64,
    pre_skip: u64,
    samples: u64,
}

impl OpusPackets {
    /// How many first bytes of each packet are kept: all of `OpusHead`'s fixed part.
    const HEAD: usize = 19;

    fn packet(&mut self, p: &Packet) -> Result<(), Unmeasured> {
        let c = Container::OggOpus;
        match self.count {
            0 => {
                if !p.head.starts_with(b"OpusHead") {
                    return Err(Unmeasured::NotSupported {
                        looks: "Ogg with a codec other than Opus",
                    });
                }
                if p.head.len() < Self::HEAD || p.head[8] & 0xF0 != 0 || p.head[9] == 0 {
                    return Err(bad(c, "its OpusHead is not version 0 or names no channel"));
                }
                self.pre_skip = u64::from(u16::from_le_bytes([p.head[10], p.head[11]]));
            }
            1 if !p.head.starts_with(b"OpusTags") => {
                return Err(bad(c, "the second packet is not OpusTags"));
            }
            1 => {}
            _ => {
                let n = opus_packet_samples(&p.head, p.len)
                    .ok_or_else(|| bad(c, format!("audio packet {} is not Opus", self.count)))?;
                self.samples = self.samples.saturating_add(n);
            }
        }
        self.count += 1;
        Ok(())
    }
}

/// Walk an OGG/Opus stream: see the module documentation.
fn ogg_opus(bytes: &[u8]) -> Result<Measured, Unmeasured> {
    let c = Container::OggOpus;
    let mut pos = 0;
    let mut serial = None;
    let mut next_seq = 0u32;
    let mut ended = false;
    let mut last_granule: Option<u64> = None;
    let mut packet = Packet::default();
    let mut in_packet = false;
    let mut packets = OpusPackets::default();
    while pos < bytes.len() {
        let at = |why: &str| bad(c, format!("{why} at byte {pos}"));
        let header = bytes
            .get(pos..pos + 27)
            .ok_or_else(|| at("a cut page header"))?;
        if &header[..4] != b"OggS" || header[4] != 0 {
            return Err(at("no Ogg page"));
        }
        let flags = header[5];
        if flags & !0x07 != 0 || ended {
            return Err(at("a page after the stream's end or with unknown flags"));
        }
        let granule = u64::from_le_bytes(header[6..14].try_into().unwrap_or_default());
        let this_serial = u32::from_le_bytes(header[14..18].try_into().unwrap_or_default());
        let seq = u32::from_le_bytes(header[18..22].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(header[22..26].try_into().unwrap_or_default());
        let segments = usize::from(header[26]);
        let first = serial.is_none();
        if first != (flags & 0x02 != 0) || serial.is_some_and(|s| s != this_serial) {
            return Err(at("a second logical stream"));
        }
        if !first && seq != next_seq {
            return Err(at("a page out of sequence"));
        }
        serial = Some(this_serial);
        next_seq = seq.wrapping_add(1);
        ended = flags & 0x04 != 0;
        if (flags & 0x01 != 0) != in_packet {
            return Err(at("a continuation flag that does not match the packets"));
        }
        let table_end = pos + 27 + segments;
        let table = bytes
            .get(pos + 27..table_end)
            .ok_or_else(|| at("a cut segment table"))?;
        let body_len: usize = table.iter().map(|&l| usize::from(l)).sum();
        let body = bytes
            .get(table_end..table_end + body_len)
            .ok_or_else(|| at("a cut page"))?;
        let mut sum = ogg_crc(0, &header[..22]);
        sum = ogg_crc(sum, &[0; 4]);
        sum = ogg_crc(sum, &header[26..]);
        sum = ogg_crc(sum, table);
        if ogg_crc(sum, body) != crc {
            return Err(at("a page whose CRC does not match"));
        }
        let mut offset = 0;
        for &lace in table {
            let lace = usize::from(lace);
            let keep = OpusPackets::HEAD
                .saturating_sub(packet.head.len())
                .min(lace);
            packet.head.extend_from_slice(&body[offset..offset + keep]);
            packet.len += lace;
            offset += lace;
            in_packet = lace == 255;
            if !in_packet {
                packets.packet(&packet)?;
                packet = Packet::default();
            }
        }
        if granule != u64::MAX {
            if last_granule.is_some_and(|g| granule < g) {
                return Err(at("a granule position that goes back"));
            }
            last_granule = Some(granule);
        }
        pos = table_end + body_len;
    }
    if in_packet || packets.count < 2 {
        return Err(bad(c, "the stream ends inside its headers or a packet"));
    }
    let by_granule = last_granule.unwrap_or(0).saturating_sub(packets.pre_skip);
    let by_packets = packets
        .samples
        .saturating_sub(packets.pre_skip + MAX_PACKET_SAMPLES);
    Ok(Measured {
        container: c,
        seconds: by_granule.max(by_packets) as f64 / 48_000.0,
    })
}

// ---- MP3 -----------------------------------------------------------------------------------

/// An MPEG audio frame header: its length in bytes, its samples and its sample rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MpegFrame {
    len: usize,
    samples: u32,
    rate: u32,
}

/// The MPEG audio frame header at the start of `b`, if it is one (free-format frames, whose
/// length is not in the header, are not).
fn mpeg_header(b: &[u8]) -> Option<MpegFrame> {
    let h = b.get(..4)?;
    if h[0] != 0xFF || h[1] & 0xE0 != 0xE0 {
        return None;
    }
    let version = (h[1] >> 3) & 3; // 0: MPEG-2.5, 2: MPEG-2, 3: MPEG-1
    let layer = (h[1] >> 1) & 3; // 1: III, 2: II, 3: I
    let bitrate_index = usize::from(h[2] >> 4);
    let rate_index = usize::from((h[2] >> 2) & 3);
    let padding = u32::from((h[2] >> 1) & 1);
    if version == 1 || layer == 0 || bitrate_index == 0 || bitrate_index == 15 || rate_index == 3 {
        return None;
    }
    const RATES: [[u32; 3]; 3] = [
        [11_025, 12_000, 8_000],
        [22_050, 24_000, 16_000],
        [44_100, 48_000, 32_000],
    ];
    let rate = RATES[usize::from(version.saturating_sub(1))][rate_index];
    // kbit/s by (MPEG-1 or not, layer).
    const V1_L1: [u32; 15] = [
        0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448,
    ];
    const V1_L2: [u32; 15] = [
        0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
    ];
    const V1_L3: [u32; 15] = [
        0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320,
    ];
    const V2_L1: [u32; 15] = [
        0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256,
    ];
    const V2_L23: [u32; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
    let mpeg1 = version == 3;
    let kbps = match (mpeg1, layer) {
        (true, 3) => V1_L1,
        (true, 2) => V1_L2,
        (true, _) => V1_L3,
        (false, 3) => V2_L1,
        (false, _) => V2_L23,
    }[bitrate_index];
    let bps = kbps * 1000;
    let (len, samples) = match layer {
        3 => ((12 * bps / rate + padding) * 4, 384),
        2 => (144 * bps / rate + padding, 1152),
        _ if mpeg1 => (144 * bps / rate + padding, 1152),
        _ => (72 * bps / rate + padding, 576),
    };
    Some(MpegFrame {
        len: len as usize,
        samples,
        rate,
    })
}

/// The length of an ID3v2 tag at the start of `b` (0 without one); `None` when it is malformed.
fn id3v2_len(b: &[u8]) -> Option<usize> {
    if !b.starts_with(b"ID3") {
        return Some(0);
    }
    let h = b.get(..10)?;
    let size = h[6..10].iter().try_fold(0usize, |acc, &x| {
        (x < 0x80).then_some((acc << 7) | usize::from(x))
    })?;
    let footer = if h[5] & 0x10 != 0 { 10 } else { 0 };
    Some(10 + size + footer)
}

/// Walk an MP3 file frame by frame: see the module documentation.
fn mp3(bytes: &[u8]) -> Result<Measured, Unmeasured> {
    let c = Container::Mp3;
    let mut pos = id3v2_len(bytes).ok_or_else(|| bad(c, "a malformed ID3v2 tag"))?;
    let (mut frames, mut samples) = (0u64, 0u64);
    let mut first: Option<MpegFrame> = None;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        if rest.len() == 128 && rest.starts_with(b"TAG") {
            break; // an ID3v1 tag ends the file
        }
        let frame = mpeg_header(rest)
            .ok_or_else(|| bad(c, format!("no MPEG audio frame at byte {pos}")))?;
        if first.is_some_and(|f| f.rate != frame.rate || f.samples != frame.samples) {
            return Err(bad(
                c,
                format!("a frame of another MPEG version or layer at byte {pos}"),
            ));
        }
        first = Some(frame);
        frames += 1;
        samples += u64::from(frame.samples);
        // A cut last frame still counts: the decoder plays what it can of it.
        pos = pos.saturating_add(frame.len.max(4));
    }
    match first {
        Some(f) if frames > 0 => Ok(Measured {
            container: c,
            seconds: samples as f64 / f64::from(f.rate),
        }),
        _ => Err(bad(c, "no MPEG audio frame")),
    }
}

// ---- WAV -----------------------------------------------------------------------------------

/// Read the RIFF chunks of a WAV file: see the module documentation.
fn wav(bytes: &[u8]) -> Result<Measured, Unmeasured> {
    let c = Container::Wav;
    let mut pos = 12;
    let mut fmt: Option<&[u8]> = None;
    let mut data: Option<usize> = None;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let size = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap_or_default());
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let body = pos + 8;
        let available = bytes.len() - body;
        match id {
            b"data" if data.is_some() => return Err(bad(c, "two data chunks")),
            // A streamed file may declare more data than it holds: what is there plays.
            b"data" => data = Some(size.min(available)),
            _ if size > available => {
                return Err(bad(c, format!("a chunk overruns the file at byte {pos}")));
            }
            b"fmt " => fmt = Some(&bytes[body..body + size]),
            _ => {}
        }
        pos = body.saturating_add(size).saturating_add(size & 1);
    }
    let (Some(fmt), Some(data)) = (fmt, data) else {
        return Err(bad(c, "no fmt or no data chunk"));
    };
    if fmt.len() < 16 {
        return Err(bad(c, "a short fmt chunk"));
    }
    let u16_at = |i: usize| u16::from_le_bytes([fmt[i], fmt[i + 1]]);
    let mut format = u16_at(0);
    if format == 0xFFFE && fmt.len() >= 26 {
        format = u16_at(24); // WAVE_FORMAT_EXTENSIBLE: the sub-format GUID's first two bytes
    }
    if !matches!(format, 1 | 3 | 6 | 7) {
        return Err(Unmeasured::NotSupported {
            looks: "WAV with compressed audio",
        });
    }
    let channels = u32::from(u16_at(2));
    let rate = u32::from_le_bytes([fmt[4], fmt[5], fmt[6], fmt[7]]);
    let block = u32::from(u16_at(12));
    let bits = u32::from(u16_at(14));
    if channels == 0 || !(1_000..=768_000).contains(&rate) || block == 0 {
        return Err(bad(
            c,
            "no channel, an implausible sample rate or no block size",
        ));
    }
    if block != channels * bits.div_ceil(8) {
        return Err(bad(
            c,
            "a block size that does not match its channels and bits",
        ));
    }
    Ok(Measured {
        container: c,
        seconds: data as f64 / f64::from(block) / f64::from(rate),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &[u8] = include_bytes!("../../tests/fixtures/voice-hello.ogg");
    const PRE_SKIP: u64 = 312;
    const PACKET_20MS: &[u8] = &[0xF8, 0xFF, 0xFE];

    /// Pages of one stream, with correct CRCs.
    struct Ogg {
        seq: u32,
        out: Vec<u8>,
    }

    impl Ogg {
        fn new() -> Ogg {
            let mut head = b"OpusHead\x01\x01".to_vec();
            head.extend_from_slice(&(PRE_SKIP as u16).to_le_bytes());
            head.extend_from_slice(&48_000u32.to_le_bytes());
            head.extend_from_slice(&[0, 0, 0]);
            let mut o = Ogg {
                seq: 0,
                out: Vec::new(),
            };
            o.page(2, 0, &[&head]);
            o.page(0, 0, &[b"OpusTags\x04\0\0\0test\0\0\0\0"]);
            o
        }

        fn page(&mut self, flags: u8, granule: u64, packets: &[&[u8]]) {
            let mut lacing = Vec::new();
            for p in packets {
                lacing.extend(std::iter::repeat_n(255u8, p.len() / 255));
                lacing.push((p.len() % 255) as u8);
            }
            let mut page = b"OggS\0".to_vec();
            page.push(flags);
            page.extend_from_slice(&granule.to_le_bytes());
            page.extend_from_slice(&7u32.to_le_bytes());
            page.extend_from_slice(&self.seq.to_le_bytes());
            page.extend_from_slice(&[0; 4]);
            page.push(lacing.len() as u8);
            page.extend_from_slice(&lacing);
            for p in packets {
                page.extend_from_slice(p);
            }
            let crc = ogg_crc(0, &page);
            page[22..26].copy_from_slice(&crc.to_le_bytes());
            self.seq += 1;
            self.out.extend_from_slice(&page);
        }

        /// `seconds` of 20 ms packets, one page a second, each granule through `claim`; the
        /// last page ends the stream.
        fn audio(self, seconds: u64, claim: impl Fn(u64) -> u64) -> Ogg {
            self.pages(seconds, claim, true)
        }

        fn pages(mut self, seconds: u64, claim: impl Fn(u64) -> u64, end: bool) -> Ogg {
            let packets = vec![PACKET_20MS; 50];
            for s in 1..=seconds {
                let flags = if end && s == seconds { 4 } else { 0 };
                self.page(flags, claim(PRE_SKIP + s * 48_000), &packets);
            }
            self
        }
    }

    fn seconds(bytes: &[u8]) -> f64 {
        measure(bytes).expect("measured").seconds
    }

    fn inconsistent(bytes: &[u8]) -> String {
        match measure(bytes) {
            Err(e @ Unmeasured::Inconsistent { .. }) => e.to_string(),
            other => panic!("expected inconsistent, got {other:?}"),
        }
    }

    #[test]
    fn the_fixture_plays_for_its_length() {
        let m = measure(FIXTURE).unwrap();
        assert_eq!(m.container, Container::OggOpus);
        // opusinfo: "Playback length: 0m:02.822s".
        assert!((m.seconds - 2.822).abs() < 0.001, "{}", m.seconds);
    }

    #[test]
    fn an_honest_stream_plays_its_granule_length() {
        assert_eq!(seconds(&Ogg::new().audio(5, |g| g).out), 5.0);
        assert_eq!(seconds(&Ogg::new().out), 0.0, "headers only");
    }

    /// Security round 3, item 6: a planted last page claiming 1 s, as a valid page (its CRC
    /// right) or as bytes, does not shorten 600 s.
    #[test]
    fn a_planted_last_page_is_refused() {
        let mut o = Ogg::new().audio(600, |g| g);
        let honest = o.out.clone();
        o.page(4, PRE_SKIP + 48_000, &[PACKET_20MS]);
        let why = inconsistent(&o.out);
        assert!(why.contains("after the stream's end"), "{why}");
        // Without the end flag on the real last page: the granule goes back.
        let mut o = Ogg::new().pages(600, |g| g, false);
        o.page(4, PRE_SKIP + 48_000, &[PACKET_20MS]);
        assert!(inconsistent(&o.out).contains("goes back"));
        // Bytes that only look like a page header.
        let mut planted = honest.clone();
        planted.extend_from_slice(b"OggS\0\x04");
        planted.extend_from_slice(&(PRE_SKIP + 48_000).to_le_bytes());
        assert!(inconsistent(&planted).contains("cut page header"));
        assert_eq!(seconds(&honest), 600.0);
    }

    /// Every page understating by 600×: the packets still play 600 s.
    #[test]
    fn consistently_forged_granules_do_not_shorten_the_audio() {
        let s = seconds(&Ogg::new().audio(600, |g| g / 600).out);
        assert!(s > 599.8, "{s}");
    }

    #[test]
    fn broken_streams_are_refused() {
        let good = Ogg::new().audio(3, |g| g).out;
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(inconsistent(&flipped).contains("CRC"));
        assert!(inconsistent(&good[..good.len() - 10]).contains("cut page"));
        let mut junk = good.clone();
        junk.extend_from_slice(b"trailing junk, longer than a page header");
        assert!(inconsistent(&junk).contains("no Ogg page"));
        // A page skipped.
        let mut o2 = Ogg::new();
        o2.page(0, PRE_SKIP + 48_000, &[PACKET_20MS]);
        o2.seq += 1;
        o2.page(4, PRE_SKIP + 2 * 48_000, &[PACKET_20MS]);
        assert!(inconsistent(&o2.out).contains("out of sequence"));
        // A second stream (a second first page).
        let mut two = good.clone();
        two.extend_from_slice(&Ogg::new().out);
        assert!(matches!(
            measure(&two),
            Err(Unmeasured::Inconsistent { .. })
        ));
        // A packet no Opus decoder takes (code 3 with zero frames).
        let mut o = Ogg::new();
        o.page(4, PRE_SKIP + 960, &[&[0xFB, 0x00]]);
        assert!(inconsistent(&o.out).contains("not Opus"));
        // Vorbis in Ogg.
        let mut v = Ogg {
            seq: 0,
            out: Vec::new(),
        };
        v.page(2, 0, &[b"\x01vorbis\0\0\0\0\x01"]);
        assert!(matches!(
            measure(&v.out),
            Err(Unmeasured::NotSupported { looks }) if looks.contains("other than Opus")
        ));
    }

    #[test]
    fn opus_packets_decode_to_their_toc_length() {
        for (toc, want) in [
            (0x00, 480),           // SILK 10 ms
            (0x18, 2880),          // SILK 60 ms (config 3)
            (12 << 3, 480),        // hybrid 10 ms
            (13 << 3, 960),        // hybrid 20 ms
            (16 << 3, 120),        // CELT 2.5 ms
            (31 << 3, 960),        // CELT 20 ms
            ((31 << 3) | 1, 1920), // two frames
        ] {
            assert_eq!(opus_packet_samples(&[toc, 0], 10), Some(want), "{toc:#x}");
        }
        assert_eq!(opus_packet_samples(&[(31 << 3) | 3, 6], 10), Some(5760));
        assert_eq!(
            opus_packet_samples(&[(31 << 3) | 3, 7], 10),
            None,
            "over 120 ms"
        );
        assert_eq!(opus_packet_samples(&[(31 << 3) | 3], 1), None);
        assert_eq!(opus_packet_samples(&[], 0), Some(MAX_PACKET_SAMPLES));
    }

    fn mp3(frames: usize) -> Vec<u8> {
        let mut m = b"ID3\x04\0\0\0\0\0\x0a".to_vec();
        m.extend_from_slice(&[0; 10]);
        for _ in 0..frames {
            let mut f = vec![0xFF, 0xFB, 0x90, 0x00];
            f.resize(417, 0x55);
            m.extend_from_slice(&f);
        }
        m
    }

    #[test]
    fn mp3_is_measured_by_its_frames() {
        let want = 100.0 * 1152.0 / 44_100.0;
        let m = measure(&mp3(100)).unwrap();
        assert_eq!(m.container, Container::Mp3);
        assert!((m.seconds - want).abs() < 1e-9);
        let mut tagged = mp3(100);
        tagged.extend_from_slice(b"TAG");
        tagged.resize(tagged.len() + 125, b' ');
        assert!((seconds(&tagged) - want).abs() < 1e-9);
        let cut = mp3(100);
        assert!((seconds(&cut[..cut.len() - 100]) - want).abs() < 1e-9);
        let mut junk = mp3(10);
        junk.extend_from_slice(b"junk");
        junk.extend_from_slice(&mp3(10)[20..]);
        assert!(inconsistent(&junk).contains("no MPEG audio frame"));
        assert!(matches!(
            measure(b"ID3\x04\0\0\0\0\0\0"),
            Err(Unmeasured::Inconsistent { .. })
        ));
        // MPEG-2 Layer III at 8 kbit/s, 16 kHz: 36 bytes, 576 samples.
        assert_eq!(
            mpeg_header(&[0xFF, 0xF3, 0x18, 0x00]),
            Some(MpegFrame {
                len: 36,
                samples: 576,
                rate: 16_000
            })
        );
    }

    fn wav(format: u16, rate: u32, block: u16, bits: u16, data: u32, holds: usize) -> Vec<u8> {
        let mut w = b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0".to_vec();
        w.extend_from_slice(&format.to_le_bytes());
        w.extend_from_slice(&1u16.to_le_bytes());
        w.extend_from_slice(&rate.to_le_bytes());
        w.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        w.extend_from_slice(&block.to_le_bytes());
        w.extend_from_slice(&bits.to_le_bytes());
        w.extend_from_slice(b"LIST\x04\0\0\0abcd");
        w.extend_from_slice(b"data");
        w.extend_from_slice(&data.to_le_bytes());
        w.resize(w.len() + holds, 0);
        w
    }

    #[test]
    fn wav_is_measured_by_its_data() {
        assert_eq!(seconds(&wav(1, 16_000, 2, 16, 32_000, 32_000)), 1.0);
        // Streamed: more declared than held; what is there plays.
        assert_eq!(seconds(&wav(1, 8_000, 1, 8, u32::MAX, 4_000)), 0.5);
        assert!(matches!(
            measure(&wav(0x55, 16_000, 2, 16, 100, 100)),
            Err(Unmeasured::NotSupported { .. })
        ));
        assert!(inconsistent(&wav(1, 16_000, 4, 16, 100, 100)).contains("block size"));
        assert!(inconsistent(&wav(1, 10, 2, 16, 100, 100)).contains("sample rate"));
        assert!(inconsistent(&b"RIFF\0\0\0\0WAVE"[..]).contains("no fmt"));
    }

    #[test]
    fn other_bytes_are_named_and_refused() {
        for (bytes, looks) in [
            (&b"\x89PNG\r\n\x1a\n...."[..], "PNG"),
            (b"\xFF\xD8\xFF\xE0....", "JPEG"),
            (b"fLaC\0\0\0\x22", "FLAC"),
            (b"\0\0\0\x20ftypM4A ", "M4A"),
            (b"\x1A\x45\xDF\xA3\x01", "WebM"),
            (b"hello world", "unknown"),
            (b"", "empty"),
        ] {
            match measure(bytes) {
                Err(e @ Unmeasured::NotSupported { .. }) => {
                    assert!(e.to_string().contains(looks), "{e}");
                    assert!(e.to_string().contains("OGG/Opus"), "{e}");
                }
                other => panic!("{looks}: {other:?}"),
            }
        }
    }

    proptest::proptest! {
        /// Any bytes, and any damage to the fixture: no panic, and a measured length is finite.
        #[test]
        fn any_bytes_are_safe(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            cut in 0usize..FIXTURE.len(),
            flip in 0usize..FIXTURE.len(),
        ) {
            for b in [bytes.clone(), [b"OggS".as_slice(), &bytes].concat(), [b"ID3".as_slice(), &bytes].concat(),
                      [b"RIFF\0\0\0\0WAVE".as_slice(), &bytes].concat(), FIXTURE[..cut].to_vec()] {
                if let Ok(m) = measure(&b) {
                    proptest::prop_assert!(m.seconds.is_finite() && m.seconds >= 0.0);
                }
            }
            let mut damaged = FIXTURE.to_vec();
            damaged[flip] ^= 0x20;
            // A flipped byte in a CRC-checked page never yields a length.
            proptest::prop_assert!(measure(&damaged).is_err());
        }
    }
}
