//! Synthetic audio files for the length checks (SPEC §19): OGG/Opus streams built page by page
//! with Ogg's own CRC (so a forged page is a *valid* page, which only the walk of every page
//! and packet can catch), WAV and MP3 files. None of it is playable speech: the fake
//! transcription server does not decode.

/// Ogg's CRC-32: polynomial 0x04C11DB7, not reflected, initial value 0, no final xor (the
/// checksum field itself counted as zero).
pub fn ogg_crc(bytes: &[u8]) -> u32 {
    let mut crc: u32 = 0;
    for &b in bytes {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The samples at 48 kHz an Opus decoder drops at the start (what `OpusHead` says).
pub const PRE_SKIP: u16 = 312;

/// A 20 ms Opus packet: TOC config 31 (CELT fullband, 20 ms), one frame, and two bytes of
/// frame data.
pub const PACKET_20MS: &[u8] = &[0xF8, 0xFF, 0xFE];

/// Writes Ogg pages of one logical stream.
pub struct OggWriter {
    pub serial: u32,
    pub seq: u32,
    pub out: Vec<u8>,
}

impl Default for OggWriter {
    fn default() -> Self {
        OggWriter {
            serial: 0x5EED,
            seq: 0,
            out: Vec::new(),
        }
    }
}

impl OggWriter {
    /// One page holding whole `packets` (each under 255 × 255 bytes), with header `flags`
    /// (2 = first page, 4 = last page) and `granule`.
    pub fn page(&mut self, flags: u8, granule: u64, packets: &[&[u8]]) {
        let mut lacing = Vec::new();
        for p in packets {
            lacing.extend(std::iter::repeat_n(255u8, p.len() / 255));
            lacing.push((p.len() % 255) as u8);
        }
        assert!(lacing.len() <= 255, "too many segments for one page");
        let mut page = Vec::new();
        page.extend_from_slice(b"OggS");
        page.push(0);
        page.push(flags);
        page.extend_from_slice(&granule.to_le_bytes());
        page.extend_from_slice(&self.serial.to_le_bytes());
        page.extend_from_slice(&self.seq.to_le_bytes());
        page.extend_from_slice(&[0; 4]);
        page.push(lacing.len() as u8);
        page.extend_from_slice(&lacing);
        for p in packets {
            page.extend_from_slice(p);
        }
        let crc = ogg_crc(&page);
        page[22..26].copy_from_slice(&crc.to_le_bytes());
        self.seq += 1;
        self.out.extend_from_slice(&page);
    }
}

/// The `OpusHead` packet: version 1, mono, [`PRE_SKIP`], 48 kHz input, no gain, mapping 0.
pub fn opus_head() -> Vec<u8> {
    let mut h = b"OpusHead".to_vec();
    h.push(1);
    h.push(1);
    h.extend_from_slice(&PRE_SKIP.to_le_bytes());
    h.extend_from_slice(&48_000u32.to_le_bytes());
    h.extend_from_slice(&0i16.to_le_bytes());
    h.push(0);
    h
}

/// The `OpusTags` packet with vendor "test" and no comments.
pub fn opus_tags() -> Vec<u8> {
    let mut t = b"OpusTags".to_vec();
    t.extend_from_slice(&4u32.to_le_bytes());
    t.extend_from_slice(b"test");
    t.extend_from_slice(&0u32.to_le_bytes());
    t
}

/// An OGG/Opus stream playing `seconds`: the two header pages, then pages of 50 packets of
/// 20 ms (one second each). `claim` maps each audio page's true granule position to the one
/// written (the identity for an honest file).
pub fn opus_stream_claiming(seconds: u32, claim: impl Fn(u64) -> u64) -> OggWriter {
    let mut w = OggWriter::default();
    w.page(2, 0, &[&opus_head()]);
    w.page(0, 0, &[&opus_tags()]);
    let packets = vec![PACKET_20MS; 50];
    for s in 0..seconds {
        let granule = u64::from(PRE_SKIP) + u64::from(s + 1) * 48_000;
        let flags = if s + 1 == seconds { 4 } else { 0 };
        w.page(flags, claim(granule), &packets);
    }
    w
}

/// An honest OGG/Opus stream playing `seconds`.
pub fn opus_stream(seconds: u32) -> Vec<u8> {
    opus_stream_claiming(seconds, |g| g).out
}

/// A WAV file of `ms` milliseconds of silence (16 kHz, 16-bit mono PCM).
pub fn silent_wav(ms: u32) -> Vec<u8> {
    let samples = 16 * ms;
    let data_len = samples * 2;
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data_len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&1u16.to_le_bytes()); // mono
    w.extend_from_slice(&16_000u32.to_le_bytes());
    w.extend_from_slice(&32_000u32.to_le_bytes());
    w.extend_from_slice(&2u16.to_le_bytes());
    w.extend_from_slice(&16u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_len.to_le_bytes());
    w.resize(w.len() + data_len as usize, 0);
    w
}

/// `frames` MPEG-1 Layer III frames at 128 kbit/s and 44.1 kHz (417 bytes, 1152 samples each:
/// 26.1 ms), behind a small ID3v2 tag.
pub fn mp3_frames(frames: usize) -> Vec<u8> {
    let mut m = b"ID3\x04\x00\x00\x00\x00\x00\x0a".to_vec();
    m.extend_from_slice(&[0; 10]);
    for _ in 0..frames {
        let mut frame = vec![0xFF, 0xFB, 0x90, 0x00];
        frame.resize(417, 0x55);
        m.extend_from_slice(&frame);
    }
    m
}

/// The seconds [`mp3_frames`] plays.
pub fn mp3_seconds(frames: usize) -> f64 {
    frames as f64 * 1152.0 / 44_100.0
}

/// The first bytes of a PNG image.
pub const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
