//! The key reference of `docs/configuration.md`, generated from the table: one Markdown table
//! per TOML table, placed in the doc between `<!-- keys [table] -->` and `<!-- /keys -->`.
//! `config::keys::tests::the_reference_in_the_docs_is_the_generated_one` fails when the doc differs;
//! `AGENTD_REGEN_DOCS=1` makes it rewrite the doc instead.

use super::{Spec, TABLES, Table};

/// The command that rewrites the reference in the doc.
pub const REGENERATE: &str = "AGENTD_REGEN_DOCS=1 cargo test --locked --lib config::keys::tests::the_reference_in_the_docs_is_the_generated_one";

/// Every TOML table of the key table, in order, with its reference.
pub fn tables() -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, Vec<&'static dyn Spec>, Option<bool>)> = Vec::new();
    for group in TABLES {
        let entries_live = entries_live(group);
        for key in group.specs() {
            match out.last_mut() {
                Some((table, keys, _)) if *table == key.table() => keys.push(key),
                _ => out.push((key.table(), vec![key], entries_live)),
            }
        }
    }
    out.into_iter()
        .map(|(table, keys, live)| (table, markdown(&keys, live)))
        .collect()
}

fn entries_live(group: &Table) -> Option<bool> {
    group.entries().map(|(_, live, _)| live)
}

fn markdown(keys: &[&dyn Spec], entries_live: Option<bool>) -> String {
    let mut out =
        String::from("| Key | Type | Default | On SIGHUP | Meaning |\n|---|---|---|---|---|\n");
    for k in keys {
        let live = k.live().or(entries_live).unwrap_or(false);
        let row = [
            format!("`{}`", k.name()),
            k.kind(),
            k.default_text(),
            (if live { "applied" } else { "restart" }).to_string(),
            k.doc().to_string(),
        ];
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// A table cell: `|` escaped, on one line.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// `doc` with every marked reference replaced by the generated one, or the problems: a
/// table of the key table without a marker, a marker naming no table, an unclosed marker.
pub fn regenerate(doc: &str) -> Result<String, Vec<String>> {
    let generated = tables();
    let mut problems = Vec::new();
    let mut out = String::new();
    let mut seen = Vec::new();
    let mut rest = doc;
    while let Some(start) = rest.find("<!-- keys [") {
        let (before, marker) = rest.split_at(start);
        out.push_str(before);
        let Some(head_end) = marker.find("] -->") else {
            problems.push("a `<!-- keys [` marker is not closed with `] -->`".to_string());
            return Err(problems);
        };
        let table = &marker["<!-- keys [".len()..head_end];
        let head = &marker[..head_end + "] -->".len()];
        let Some(end) = marker.find("<!-- /keys -->") else {
            problems.push(format!(
                "the reference of [{table}] has no `<!-- /keys -->`"
            ));
            return Err(problems);
        };
        out.push_str(head);
        out.push('\n');
        match generated.iter().find(|(t, _)| *t == table) {
            Some((_, md)) => out.push_str(md),
            None => problems.push(format!("[{table}] is not a table of the key table")),
        }
        out.push_str("<!-- /keys -->");
        seen.push(table.to_string());
        rest = &marker[end + "<!-- /keys -->".len()..];
    }
    out.push_str(rest);
    for (table, _) in &generated {
        if !seen.iter().any(|s| s == table) {
            problems.push(format!(
                "[{table}] has no reference in the doc; add `<!-- keys [{table}] -->` and `<!-- /keys -->` where it belongs"
            ));
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}
