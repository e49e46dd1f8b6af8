//! `agentd import openclaw PATH [--apply]` (SPEC §24): moving in from OpenClaw's state
//! directory. Sessions become archived sessions (`sessions`), long-term memory and skills
//! arrive in the workspace (`workspace`), cron jobs and the Telegram allow-list are printed as
//! configuration to add (`config`). A dry run by default: the report says what would be
//! imported, what is skipped and why; `--apply` writes. The directory is hostile input
//! (`source`): plain paths below it only, no symlinks, every read bounded.

mod config;
mod sessions;
mod source;
mod workspace;

use std::fmt::Write as _;
use std::path::Path;

use crate::config::Config;

/// Why nothing was imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// PATH itself is refused.
    #[error("refused: {0}")]
    Refused(String),
}

/// The parts of the report, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    Sessions,
    Memory,
    Skills,
    Schedules,
    Telegram,
}

impl Section {
    fn title(self) -> &'static str {
        match self {
            Section::Sessions => "sessions",
            Section::Memory => "memory",
            Section::Skills => "skills",
            Section::Schedules => "cron jobs",
            Section::Telegram => "telegram allow-list",
        }
    }
}

/// What happened to one thing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Imported,
    WouldImport,
    /// Printed as configuration for the user to add.
    Printed,
    Skipped(String),
}

#[derive(Debug, Clone)]
pub struct Item {
    pub section: Section,
    pub what: String,
    pub outcome: Outcome,
    pub detail: String,
}

impl Item {
    fn done(section: Section, what: String, detail: String) -> Item {
        Item {
            section,
            what,
            outcome: Outcome::Imported,
            detail,
        }
    }
    fn would(section: Section, what: String, detail: String) -> Item {
        Item {
            section,
            what,
            outcome: Outcome::WouldImport,
            detail,
        }
    }
    fn printed(section: Section, what: String) -> Item {
        Item {
            section,
            what,
            outcome: Outcome::Printed,
            detail: String::new(),
        }
    }
}

/// The import's report.
#[derive(Debug)]
pub struct Report {
    pub source: std::path::PathBuf,
    pub apply: bool,
    pub items: Vec<Item>,
    /// TOML for the user to add to `agentd.toml` (never written).
    pub config: String,
    /// Memory notes written (the memory index then needs a run).
    pub notes_written: usize,
}

const SYMLINK: &str = "a symlink (refused: it could point outside the directory)";

impl Report {
    fn add(&mut self, item: Item) {
        self.items.push(item);
    }

    fn skip(&mut self, section: Section, what: &str, why: impl Into<String>) {
        self.items.push(Item {
            section,
            what: what.to_string(),
            outcome: Outcome::Skipped(why.into()),
            detail: String::new(),
        });
    }

    /// How many items ended as `outcome` (skips compared by kind only).
    pub fn count(&self, section: Section, outcome: &Outcome) -> usize {
        let same = |o: &Outcome| match (o, outcome) {
            (Outcome::Skipped(_), Outcome::Skipped(_)) => true,
            (a, b) => a == b,
        };
        (self.items.iter())
            .filter(|i| i.section == section && same(&i.outcome))
            .count()
    }

    /// The report as the command prints it.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mode = if self.apply {
            "imported"
        } else {
            "dry run: nothing written; run again with --apply to import"
        };
        let _ = writeln!(
            s,
            "OpenClaw state directory {} ({mode})",
            self.source.display()
        );
        let mut items = self.items.clone();
        items.sort_by_key(|i| i.section);
        let mut last = None;
        for i in &items {
            if last != Some(i.section) {
                let _ = writeln!(s, "{}:", i.section.title());
                last = Some(i.section);
            }
            let (label, why) = match &i.outcome {
                Outcome::Imported => ("imported", None),
                Outcome::WouldImport => ("would import", None),
                Outcome::Printed => ("printed below", None),
                Outcome::Skipped(why) => ("skipped", Some(why.as_str())),
            };
            let _ = write!(s, "  {label:<13} {}", i.what);
            if !i.detail.is_empty() {
                let _ = write!(s, " {}", i.detail);
            }
            match why {
                Some(why) => {
                    let _ = writeln!(s, ": {why}");
                }
                None => s.push('\n'),
            }
        }
        if items.is_empty() {
            s.push_str("nothing found to import\n");
        }
        if !self.config.is_empty() {
            let _ = writeln!(
                s,
                "\nAdd to agentd.toml yourself if you want them (not written):\n{}",
                self.config.trim_start_matches('\n')
            );
        }
        if self.apply && self.count(Section::Sessions, &Outcome::Imported) > 0 {
            s.push_str("Run `agentd consolidate` to extract facts from the imported sessions into long-term memory.\n");
        }
        s
    }
}

/// Import (or, without `apply`, plan the import of) the OpenClaw state directory at `path`
/// into the agentd of `cfg`. Blocking file work: a command-line front end's. The memory
/// index is the caller's next step when `notes_written` is not zero.
pub fn openclaw(cfg: &Config, path: &Path, apply: bool) -> Result<Report, ImportError> {
    let src = source::Source::open(path)?;
    let mut r = Report {
        source: src.root().to_path_buf(),
        apply,
        items: Vec::new(),
        config: String::new(),
        notes_written: 0,
    };
    let sessions_dir = cfg.paths.state_dir.join("sessions");
    sessions::import(&src, &sessions_dir, cfg, &mut r);
    workspace::memory(&src, cfg, &mut r);
    workspace::skills(&src, cfg, &mut r);
    config::cron(&src, &mut r);
    config::telegram(&src, &mut r);
    Ok(r)
}
