//! The HTTP API (SPEC §10.2). Only this module names `axum`.

pub mod backend;
