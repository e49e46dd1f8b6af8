//! `GET /api/v1/approvals` and `POST /api/v1/approvals/{id}` (SPEC §18.1).

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Json, Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::reply::Reply;
use super::server::ApiState;
use crate::session::approval::Decision;

type Shared = State<Arc<ApiState>>;
type Answer = Result<Reply, Reply>;

/// `POST /api/v1/approvals/{id}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecideIn {
    decision: String,
}

/// `GET /api/v1/approvals`: `{approvals: [...]}`.
pub(crate) async fn list(State(state): Shared) -> Answer {
    let backend = state.backend();
    Ok(Reply::ok(backend.approvals().await?))
}

/// `POST /api/v1/approvals/{id}` `{decision}` → `{id, decision}`; 404 unknown, 409 decided.
pub(crate) async fn decide(
    State(state): Shared,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<DecideIn>, JsonRejection>,
) -> Answer {
    let Path(id) = id.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let Json(DecideIn { decision }) =
        body.map_err(|e| Reply::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let Some(d) = Decision::parse(&decision) else {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            format!("decision {decision:?} is not one of \"approve\", \"always\", \"deny\""),
        ));
    };
    if !crate::tools::approval::is_valid_id(&id) {
        return Err(Reply::error(
            StatusCode::NOT_FOUND,
            format!("no approval with id {id:?}: approval ids look like ap-xxxxxxxxxx"),
        ));
    }
    let backend = state.backend();
    Ok(Reply::ok(backend.decide_approval(id, d).await?))
}
