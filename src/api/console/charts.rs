//! The cost page's pictures, drawn as SVG on the server: spend per day stacked by model or
//! source, the cache hit ratio per day, the top sessions. Names in them are escaped text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::html::{Html, esc, usd};

/// Colours of the stacks, in order; further keys reuse them.
const PALETTE: [&str; 8] = [
    "#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
];
const W: f64 = 720.0;
/// Right margin, so the last bar and point stay inside the frame.
const RIGHT: f64 = 8.0;
const H: f64 = 220.0;
/// Left margin for the axis labels, bottom margin for the dates.
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 24.0;

fn day_of(r: &Value) -> String {
    r["day"].as_str().unwrap_or("").to_string()
}

/// Stacked bars: one per day that has rows, stacked by `key` (`model` or `source`).
pub(crate) fn spend_per_day(h: &mut Html, rows: &[Value], key: &str) {
    let mut days: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut keys: BTreeMap<String, f64> = BTreeMap::new();
    for r in rows {
        let k = r[key].as_str().unwrap_or("(unknown)").to_string();
        let c = r["cost_usd"].as_f64().unwrap_or(0.0);
        *days
            .entry(day_of(r))
            .or_default()
            .entry(k.clone())
            .or_default() += c;
        *keys.entry(k).or_default() += c;
    }
    if days.is_empty() {
        h.el("p", "No spend in the last 30 days.");
        return;
    }
    let color: BTreeMap<&str, &str> = keys
        .keys()
        .enumerate()
        .map(|(i, k)| (k.as_str(), PALETTE[i % PALETTE.len()]))
        .collect();
    let max = days
        .values()
        .map(|d| d.values().sum::<f64>())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let n = 30.0;
    let slot = (W - LEFT - RIGHT) / n;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="Spend per day for the last 30 days, stacked by {key}">"#
    );
    axis(&mut svg, &usd(max));
    let first = rows.iter().map(day_of).min().unwrap_or_default();
    let last = rows.iter().map(day_of).max().unwrap_or_default();
    let start = first_day(rows);
    for (day, stack) in &days {
        let idx = day_index(day, start);
        let x = LEFT + idx as f64 * slot + 1.0;
        let mut y = H - BOTTOM;
        for (k, c) in stack {
            let bh = (c / max) * (H - BOTTOM - 8.0);
            y -= bh;
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}</title></rect>"#,
                (slot - 2.0).max(1.0),
                color.get(k.as_str()).copied().unwrap_or(PALETTE[0]),
                esc(&format!("{day} · {k}: {}", usd(*c)))
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="{}" class="label">{}</text><text x="{}" y="{}" class="label" text-anchor="end">{}</text></svg>"#,
        H - 6.0,
        esc(&start.map(|d| d.to_string()).unwrap_or(first)),
        W - RIGHT,
        H - 6.0,
        esc(&last)
    );
    h.raw(&svg);
    h.raw(r#"<ul class="legend">"#);
    for (k, total) in &keys {
        let _ = write!(
            h,
            r#"<li><svg class="swatch" viewBox="0 0 12 12" aria-hidden="true"><rect width="12" height="12" fill="{}"/></svg>"#,
            color.get(k.as_str()).copied().unwrap_or(PALETTE[0])
        );
        h.text(&format!("{k}: {}", usd(*total))).raw("</li>");
    }
    h.raw("</ul>");
}

/// The first of the 30 days that end on the latest day of `rows`.
fn first_day(rows: &[Value]) -> Option<chrono::NaiveDate> {
    let last = rows.iter().map(day_of).max()?;
    chrono::NaiveDate::parse_from_str(&last, "%Y-%m-%d")
        .ok()?
        .checked_sub_days(chrono::Days::new(29))
}

/// `day`'s place (0-29) on the axis that starts at `start`.
fn day_index(day: &str, start: Option<chrono::NaiveDate>) -> i64 {
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .ok()
        .zip(start)
        .map_or(0, |(d, s)| (d - s).num_days().clamp(0, 29))
}

/// The axis line and the top value's label.
fn axis(svg: &mut String, top: &str) {
    let _ = write!(
        svg,
        r#"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" class="axis"/><text x="4" y="20" class="label">{}</text>"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        esc(top)
    );
}

/// The cache hit ratio (reads / all prompt tokens) of each day with prompt tokens, as a line.
pub(crate) fn hit_ratio(h: &mut Html, rows: &[Value]) {
    let mut days: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for r in rows {
        let e = days.entry(day_of(r)).or_default();
        e.0 += r["input_tokens"].as_u64().unwrap_or(0);
        e.1 += r["cache_read_tokens"].as_u64().unwrap_or(0);
        e.2 += r["cache_write_tokens"].as_u64().unwrap_or(0);
    }
    let points: Vec<(String, f64)> = days
        .into_iter()
        .filter_map(|(d, (i, r, w))| crate::store::hit_ratio(i, r, w).map(|x| (d, x)))
        .collect();
    if points.is_empty() {
        h.el("p", "No prompt tokens in the last 30 days.");
        return;
    }
    let start = first_day(rows);
    let slot = (W - LEFT - RIGHT) / 30.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="Cache hit ratio per day">"#
    );
    axis(&mut svg, "100%");
    let _ = write!(
        svg,
        r#"<text x="4" y="{}" class="label">0%</text>"#,
        H - BOTTOM
    );
    let coords: Vec<(f64, f64, &str, f64)> = points
        .iter()
        .map(|(d, r)| {
            let x = LEFT + (day_index(d, start) as f64 + 0.5) * slot;
            let y = (H - BOTTOM) - r * (H - BOTTOM - 8.0);
            (x, y, d.as_str(), *r)
        })
        .collect();
    let line: Vec<String> = coords
        .iter()
        .map(|(x, y, ..)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = write!(
        svg,
        r#"<polyline points="{}" class="line"/>"#,
        line.join(" ")
    );
    for (x, y, d, r) in &coords {
        let _ = write!(
            svg,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" class="dot"><title>{}</title></circle>"#,
            esc(&format!("{d}: {:.0}%", r * 100.0))
        );
    }
    svg.push_str("</svg>");
    h.raw(&svg);
}

/// The most expensive sessions (at most 10): name, a bar (`<meter>`) and the amount.
pub(crate) fn top_bars(h: &mut Html, groups: &[Value]) {
    let top: Vec<&Value> = groups.iter().take(10).collect();
    if top.is_empty() {
        h.el("p", "No spend this month.");
        return;
    }
    let max = top
        .iter()
        .map(|g| g["cost_usd"].as_f64().unwrap_or(0.0))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    h.raw(r#"<ol class="bars">"#);
    for g in top {
        let c = g["cost_usd"].as_f64().unwrap_or(0.0);
        let key = g["key"].as_str().unwrap_or("");
        h.raw("<li>").el("span class=\"key\"", key);
        let _ = write!(
            h,
            r#"<meter min="0" max="{max}" value="{c}" aria-label="{}"></meter>"#,
            esc(&format!("{key}: {}", usd(c)))
        );
        h.el("span class=\"amount\"", &usd(c)).raw("</li>");
    }
    h.raw("</ol>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_in_charts_are_text() {
        let rows = vec![
            json!({"day": "2026-12-01", "model": "<script>x</script>", "source": "http",
            "cost_usd": 1.0, "input_tokens": 10, "cache_read_tokens": 30, "cache_write_tokens": 0}),
        ];
        let mut h = Html::default();
        spend_per_day(&mut h, &rows, "model");
        hit_ratio(&mut h, &rows);
        top_bars(
            &mut h,
            &[json!({"key": "<img src=x onerror=alert(1)>", "cost_usd": 2.0})],
        );
        let out = h.into_string();
        assert!(!out.contains("<script>"), "{out}");
        assert!(!out.contains("<img"), "{out}");
        assert!(out.contains("&lt;script&gt;"));
        assert!(out.contains("75%"), "{out}");
    }
}
