//! Outbound networking: the SSRF guard and fetcher (`ssrf`) and HTML-to-text conversion
//! (`html`) for the tools the model can steer (reliability notes §3.9), and the error-text
//! scrubber every HTTP client uses (`scrub`: no URL, no secret); `download`, the capped
//! streaming of a response into a file that every channel's downloads go through.

pub mod download;
pub mod html;
pub mod scrub;
pub mod ssrf;
pub mod tls;
