//! The user's time zone (`agent.timezone`, SPEC §3) as a chrono [`TimeZone`]: the zone's file
//! from the system's time zone database (`$TZDIR`, `/usr/share/zoneinfo`, `/etc/zoneinfo`; or
//! `/etc/localtime` itself for the system's zone), read once and
//! parsed by jiff (`TimeZone::tzif`). jiff's own database lookup is not used: it lists the
//! whole directory and re-checks it every few minutes, for one zone.
//!
//! Why not chrono-tz: it compiles the whole IANA database into the binary, about 1.9 MB of
//! the file (1 MB of it tables of pointers that the loader relocates at every start, so
//! private memory too: issue 14), for the one zone a daemon uses. The system's copy is also the
//! one the OS keeps current when a government changes its rules.
//!
//! A [`Zone`] is cheap to clone (jiff shares the parsed zone). `UTC` needs no database.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{FixedOffset, MappedLocalTime, NaiveDate, NaiveDateTime, NaiveTime, TimeZone};
use jiff::Timestamp;
use jiff::tz::{AmbiguousOffset, TimeZone as JiffZone};

/// An IANA time zone, e.g. `Europe/Berlin`.
#[derive(Clone, PartialEq, Eq)]
pub struct Zone {
    tz: JiffZone,
    name: Arc<str>,
}

/// Why a zone name was not accepted.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown time zone {name:?} ({reason}); use an IANA name such as \"Europe/Berlin\" or \"UTC\", found in the system's time zone database (/usr/share/zoneinfo, package tzdata; legacy names such as \"US/Eastern\" need tzdata-legacy on newer Debian and Ubuntu; or an absolute $TZDIR)"
)]
pub struct ZoneError {
    name: String,
    reason: String,
}

impl Zone {
    /// Coordinated Universal Time.
    pub fn utc() -> Self {
        Zone {
            tz: JiffZone::UTC,
            name: Arc::from("UTC"),
        }
    }

    /// The zone named `name` in the system's database (`$TZDIR`, else `/usr/share/zoneinfo`,
    /// else `/etc/zoneinfo`). `UTC` always exists.
    pub fn get(name: &str) -> Result<Self, ZoneError> {
        if name == "UTC" {
            return Ok(Self::utc());
        }
        let err = |reason: &str| ZoneError {
            name: name.chars().take(64).collect(),
            reason: reason.to_string(),
        };
        if !valid_name(name) {
            return Err(err("not a zone name"));
        }
        let mut tried = Vec::new();
        for dir in database_dirs() {
            let path = dir.join(name);
            match read_bounded(&path) {
                Ok(bytes) => return Self::parse(name, &path, &bytes).map_err(|e| err(&e)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    tried.push(dir.display().to_string());
                }
                Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                    return Err(err(&format!(
                        "{} is a directory, not a zone",
                        path.display()
                    )));
                }
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(err(&format!("not in {}", tried.join(", "))))
    }

    /// The zone in `/etc/localtime` (a copy of a zone file, as containers often have), named
    /// `name` (what iana-time-zone read, or "localtime").
    pub fn local_file(name: &str) -> Result<Self, ZoneError> {
        let path = Path::new("/etc/localtime");
        read_bounded(path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|bytes| Self::parse(name, path, &bytes))
            .map_err(|reason| ZoneError {
                name: name.chars().take(64).collect(),
                reason,
            })
    }

    /// The zone named `name` from the TZif bytes read from `path`.
    fn parse(name: &str, path: &Path, bytes: &[u8]) -> Result<Self, String> {
        let tz = JiffZone::tzif(name, bytes)
            .map_err(|e| format!("{} is not a time zone file: {e}", path.display()))?;
        Ok(Zone {
            tz,
            name: Arc::from(name),
        })
    }

    /// The IANA name, as the database spells it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The offset in effect at `secs` (Unix seconds), with its abbreviation.
    fn offset_at(&self, secs: i64) -> ZoneOffset {
        let secs = secs.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
        let ts = Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH);
        let info = self.tz.to_offset_info(ts);
        // chrono takes offsets under 24 h; jiff's reach ±25:59:59, none of them in a real zone.
        let fixed = FixedOffset::east_opt(info.offset().seconds())
            .unwrap_or_else(|| FixedOffset::east_opt(0).expect("zero offset"));
        ZoneOffset {
            zone: self.clone(),
            fixed,
            abbr: Abbr::new(info.abbreviation()),
        }
    }
}

/// An IANA name: `/`-separated parts of letters, digits, `_`, `+` and `-`, none of them `.`
/// or `..` (so a name never leaves the database directory), at most 64 bytes. Not the
/// database's `right/` (leap seconds counted, which neither jiff nor chrono does) and `posix/`
/// copies, which chrono-tz did not accept either.
fn valid_name(name: &str) -> bool {
    let first = name.split('/').next().unwrap_or_default();
    name.len() <= 64
        && first != "right"
        && first != "posix"
        && name.split('/').all(|part| {
            !part.is_empty()
                && !part.starts_with('.')
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-'))
        })
}

/// Where time zone files are looked up: `$TZDIR` when set (absolute; a relative one is not
/// used), then the usual places; a zone not found in one is looked for in the next.
fn database_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("TZDIR").map(PathBuf::from)
        && dir.is_absolute()
    {
        dirs.push(dir);
    }
    dirs.extend(["/usr/share/zoneinfo", "/etc/zoneinfo"].map(PathBuf::from));
    dirs
}

/// A zone file, at most 256 KiB (the largest in the database is under 4 KiB).
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    const MAX: u64 = 256 * 1024;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX {
        return Err(std::io::Error::other("larger than 256 KiB"));
    }
    Ok(bytes)
}

impl std::str::FromStr for Zone {
    type Err = ZoneError;

    fn from_str(name: &str) -> Result<Self, ZoneError> {
        Zone::get(name)
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The offset of a [`Zone`] at one instant; displays as its abbreviation (`CET`), which is
/// what chrono's `%Z` prints; `{:?}` prints the same, as chrono-tz's did.
#[derive(Clone, PartialEq, Eq)]
pub struct ZoneOffset {
    zone: Zone,
    fixed: FixedOffset,
    abbr: Abbr,
}

impl chrono::Offset for ZoneOffset {
    fn fix(&self) -> FixedOffset {
        self.fixed
    }
}

impl fmt::Debug for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.abbr.as_str() {
            Some(a) => f.write_str(a),
            None => fmt::Display::fmt(&self.fixed, f),
        }
    }
}

/// A zone abbreviation kept inline (the database's are 3–6 bytes); a longer one is not kept
/// and the numeric offset is shown instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Abbr {
    len: u8,
    bytes: [u8; 15],
}

impl Abbr {
    fn new(s: &str) -> Self {
        let mut bytes = [0; 15];
        if s.len() > bytes.len() {
            return Abbr { len: 0, bytes };
        }
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Abbr {
            len: s.len() as u8,
            bytes,
        }
    }

    fn as_str(&self) -> Option<&str> {
        let s = std::str::from_utf8(&self.bytes[..usize::from(self.len)]).ok()?;
        (!s.is_empty()).then_some(s)
    }
}

impl TimeZone for Zone {
    type Offset = ZoneOffset;

    fn from_offset(offset: &ZoneOffset) -> Self {
        offset.zone.clone()
    }

    fn offset_from_local_date(&self, local: &NaiveDate) -> MappedLocalTime<ZoneOffset> {
        self.offset_from_local_datetime(&local.and_time(NaiveTime::MIN))
    }

    fn offset_from_local_datetime(&self, local: &NaiveDateTime) -> MappedLocalTime<ZoneOffset> {
        let wall = local.and_utc().timestamp();
        let (lo, hi) = (Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
        let Some(ts) = Timestamp::from_second(wall.clamp(lo, hi)).ok() else {
            return MappedLocalTime::None;
        };
        let civil = jiff::tz::Offset::UTC.to_datetime(ts);
        let at = |offset: jiff::tz::Offset| self.offset_at(wall - i64::from(offset.seconds()));
        match self.tz.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => MappedLocalTime::Single(at(offset)),
            // The wall time occurs twice (clocks set back): first with the earlier offset.
            AmbiguousOffset::Fold { before, after } => {
                MappedLocalTime::Ambiguous(at(before), at(after))
            }
            // Skipped (clocks set forward): no instant has this wall time.
            AmbiguousOffset::Gap { .. } => MappedLocalTime::None,
        }
    }

    fn offset_from_utc_date(&self, utc: &NaiveDate) -> ZoneOffset {
        self.offset_from_utc_datetime(&utc.and_time(NaiveTime::MIN))
    }

    fn offset_from_utc_datetime(&self, utc: &NaiveDateTime) -> ZoneOffset {
        self.offset_at(utc.and_utc().timestamp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Offset, Utc};
    use proptest::prelude::*;

    /// Zones whose rules have not changed since 2000 (so any recent tzdata agrees with the
    /// copy inside chrono-tz), including a half-hour DST (Lord Howe) and a fractional offset.
    const ZONES: &[&str] = &[
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
        "Australia/Sydney",
        "Asia/Kathmandu",
    ];
    /// 2000-01-01 .. 2026-01-01 (Unix seconds): rules settled in any recent tzdata and in
    /// chrono-tz's copy, so a newer system database that changes a future rule does not fail
    /// the comparison.
    const FROM: i64 = 946_684_800;
    const TO: i64 = 1_767_225_600;

    fn both(name: &str) -> (Zone, chrono_tz::Tz) {
        (Zone::get(name).unwrap(), name.parse().unwrap())
    }

    #[test]
    fn utc_needs_no_database_and_names_round_trip() {
        let z = Zone::get("UTC").unwrap();
        assert_eq!(z, Zone::utc());
        assert_eq!(z.name(), "UTC");
        assert_eq!(Zone::get("Europe/Berlin").unwrap().name(), "Europe/Berlin");
        assert_eq!(
            format!("{:?}", Zone::get("Asia/Kolkata").unwrap()),
            "Asia/Kolkata"
        );
        for name in ["Etc/GMT+5", "EST5EDT", "America/Argentina/Buenos_Aires"] {
            assert_eq!(Zone::get(name).unwrap().name(), name);
        }
        let t: chrono::DateTime<Utc> = "2026-01-15T12:00:00Z".parse().unwrap();
        let ny = t.with_timezone(&Zone::get("America/New_York").unwrap());
        assert_eq!(format!("{:?}", ny.offset()), "EST");
    }

    #[test]
    fn unknown_and_hostile_names_are_errors_that_say_what_to_use() {
        for bad in [
            "Mars/Olympus",
            "",
            "../../etc/passwd",
            "/etc/localtime",
            &"x".repeat(500),
            "right/Europe/Berlin",
            "posix/Europe/Berlin",
            "Europe",
            "zone.tab",
        ] {
            let e = Zone::get(bad).unwrap_err().to_string();
            assert!(e.contains("unknown time zone"), "{bad:?}: {e}");
            assert!(e.contains("Europe/Berlin") && e.contains("tzdata"), "{e}");
        }
    }

    #[test]
    fn formats_like_chrono_tz_across_a_dst_change() {
        let (ours, theirs) = both("Europe/Berlin");
        for t in [
            "2026-03-29T00:59:59Z",
            "2026-03-29T01:00:00Z",
            "2026-10-25T00:59:59Z",
            "2026-10-25T01:00:00Z",
        ] {
            let t: chrono::DateTime<Utc> = t.parse().unwrap();
            let f = "%a, %d. %b %Y - %H:%M:%S %Z %z";
            assert_eq!(
                t.with_timezone(&ours).format(f).to_string(),
                t.with_timezone(&theirs).format(f).to_string()
            );
        }
    }

    #[test]
    fn wall_times_in_gaps_and_folds_resolve_like_chrono_tz() {
        let (ours, theirs) = both("Europe/Berlin");
        let gap = NaiveDate::from_ymd_opt(2026, 3, 29)
            .unwrap()
            .and_hms_opt(2, 30, 0)
            .unwrap();
        assert_eq!(ours.from_local_datetime(&gap), MappedLocalTime::None);
        assert_eq!(theirs.from_local_datetime(&gap), MappedLocalTime::None);
        let fold = NaiveDate::from_ymd_opt(2026, 10, 25)
            .unwrap()
            .and_hms_opt(2, 30, 0)
            .unwrap();
        let MappedLocalTime::Ambiguous(a, b) = ours.from_local_datetime(&fold) else {
            panic!("fold not ambiguous")
        };
        let MappedLocalTime::Ambiguous(c, d) = theirs.from_local_datetime(&fold) else {
            panic!("chrono-tz: fold not ambiguous")
        };
        assert_eq!(
            (a.timestamp(), b.timestamp()),
            (c.timestamp(), d.timestamp())
        );
        assert_eq!(a.offset().fix().local_minus_utc(), 7200);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The system database read by jiff and the copy compiled into chrono-tz give the same
        /// offset, abbreviation and local-time resolution at any instant, and within two hours
        /// of the next transition (where wall times are skipped or repeated).
        #[test]
        fn agrees_with_chrono_tz(zone in 0..ZONES.len(), secs in FROM..TO, shift in -7200i64..7200) {
            let (ours, theirs) = both(ZONES[zone]);
            let next = ours
                .tz
                .following(Timestamp::from_second(secs).unwrap())
                .next()
                .map(|t| t.timestamp().as_second())
                .filter(|t| t + shift < TO);
            for at in [Some(secs), next.map(|t| t + shift)].into_iter().flatten() {
                let a = ours.timestamp_opt(at, 0).unwrap();
                let b = theirs.timestamp_opt(at, 0).unwrap();
                prop_assert_eq!(a.offset().fix(), b.offset().fix());
                prop_assert_eq!(a.offset().to_string(), b.offset().to_string());
                let wall = a.naive_local();
                let mine = ours.from_local_datetime(&wall).map(|t| t.timestamp());
                let reference = theirs.from_local_datetime(&wall).map(|t| t.timestamp());
                prop_assert_eq!(mine, reference);
                // Shifted by 30 minutes the wall time may land in a gap or fold: still the same.
                let near = wall + chrono::Duration::minutes(30);
                let mine = ours.from_local_datetime(&near).map(|t| t.timestamp());
                let reference = theirs.from_local_datetime(&near).map(|t| t.timestamp());
                prop_assert_eq!(mine, reference);
            }
        }
    }
}
