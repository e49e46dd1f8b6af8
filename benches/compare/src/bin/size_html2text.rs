//! Size probe (docs/BENCHMARKS.md): reads a page on stdin, decodes it with the daemon's
//! `decode_body` and converts it with html2text; compare this binary's size with `size_none`.
#![allow(dead_code)]

#[path = "../../../../src/net/html.rs"]
mod html;

use std::io::Read;

fn main() {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).unwrap();
    let text = html::decode_body(&body, None, true);
    println!(
        "{}",
        html2text::from_read(text.as_bytes(), 120).unwrap_or_default()
    );
}
