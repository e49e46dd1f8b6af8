//! Size probe (docs/BENCHMARKS.md): `size_none` plus the daemon's `decode_body` (encoding_rs),
//! no converter; `size_today` minus this is today's converter alone.
#![allow(dead_code)]

#[path = "../../../../src/net/html.rs"]
mod html;

use std::io::Read;

fn main() {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).unwrap();
    println!("{}", html::decode_body(&body, None, true));
}
