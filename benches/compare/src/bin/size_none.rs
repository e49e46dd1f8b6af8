//! Size probe (docs/BENCHMARKS.md): the baseline, reading stdin and printing it as UTF-8, with
//! no decoding and no converter.
use std::io::Read;

fn main() {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).unwrap();
    println!("{}", String::from_utf8_lossy(&body));
}
