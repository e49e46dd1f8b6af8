//! The Markdown corpus (tests/fixtures/markdown: crate READMEs and model-style answers) through
//! the Telegram path: cut by the splitter at Telegram's limit, each chunk rendered to HTML and
//! read by the fake Bot API's parser of Telegram's HTML (the one that answers "can't parse
//! entities"), with the renderer's contracts: well formed, never longer in visible text, and
//! the plain fallback never longer either.

use agentd::channels::telegram::format::{markdown_to_html, strip_to_plain};
use agentd::channels::telegram::split::{split_message, utf16_len};

use crate::support::fake_telegram::parse_telegram_html;

/// Telegram's message limit in UTF-16 units.
const LIMIT: usize = 4096;

fn corpus() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/markdown");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md") && !p.ends_with("README.md"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_markdown_corpus_renders_html_the_fake_bot_api_accepts() {
    let files = corpus();
    assert!(files.len() >= 8, "corpus: {files:?}");
    for limit in [LIMIT, 700] {
        for (name, md) in &files {
            let chunks = split_message(md, limit);
            assert!(!chunks.is_empty(), "{name}");
            for (i, chunk) in chunks.iter().enumerate() {
                let html = markdown_to_html(chunk);
                let visible = parse_telegram_html(&html).unwrap_or_else(|e| {
                    panic!("{name} chunk {i} (limit {limit}): Telegram would reject: {e}\n{html}")
                });
                assert!(
                    utf16_len(&visible) <= utf16_len(chunk),
                    "{name} chunk {i}: visible text grew"
                );
                assert!(utf16_len(&visible) <= limit, "{name} chunk {i}");
                assert!(
                    utf16_len(&strip_to_plain(chunk)) <= utf16_len(chunk),
                    "{name} chunk {i}: plain text grew"
                );
            }
        }
    }
}

/// What the renderer makes of the corpus: the formatting Telegram shows, not escaped markup.
#[test]
fn the_corpus_keeps_its_formatting() {
    let files = corpus();
    let html = |name: &str| {
        let md = &files.iter().find(|(n, _)| n == name).unwrap().1;
        split_message(md, LIMIT)
            .iter()
            .map(|c| markdown_to_html(c))
            .collect::<String>()
    };
    let tool_use = html("answer-tool-use.md");
    assert!(tool_use.contains("<b>tool use</b>"), "{tool_use}");
    assert!(tool_use.contains("<pre><code class=\"language-python\">import anthropic"));
    assert!(tool_use.contains("<blockquote><b>Note:</b>"), "{tool_use}");
    assert!(tool_use.contains("<b><i>not</i></b>"), "{tool_use}");
    assert!(tool_use.contains(
        "<a href=\"https://docs.anthropic.com/en/docs/build-with-claude/tool-use\">the tool use guide</a>"
    ));
    let table = html("answer-comparison-table.md");
    // The deliberate rules: arithmetic and snake_case stay literal, a table stays text.
    assert!(table.contains("2*3*4 = 24"), "{table}");
    assert!(table.contains("a_b_c style"), "{table}");
    assert!(table.contains("| <code>gpt-4o</code> | 128k |"), "{table}");
    assert!(table.contains("<s>Use </s>"), "{table}");
    let anyhow = html("readme-anyhow-1.0.104.md");
    assert!(
        anyhow.contains("<pre><code class=\"language-rust\">"),
        "{anyhow}"
    );
}
