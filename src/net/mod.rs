//! Outbound networking shared by the tools the model can steer: the SSRF guard and fetcher
//! (`ssrf`) and HTML-to-text conversion (`html`). Reliability notes §3.9.

pub mod html;
pub mod ssrf;
