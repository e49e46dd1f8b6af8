//! Size probe (docs/BENCHMARKS.md): reads a page on stdin, decodes it with the daemon's
//! `decode_body` and converts it with today; compare this binary's size with `size_none`.
#![allow(dead_code)]

#[path = "../../../../src/net/html.rs"]
mod html;

use std::io::Read;

fn main() {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).unwrap();
    let text = html::decode_body(&body, None, true);
    println!("{}", html::html_to_text(&text));
}
