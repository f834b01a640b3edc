//! `pods/{name}/log`: a few lines per container, and with `follow=true` a new line every
//! `SimTuning::log_interval` until the client goes away. Honours `container=` (400 when unknown,
//! as recorded), `tailLines=` and `timestamps=true`. Like the real apiserver's long-running
//! requests, the response carries no `X-Kubernetes-Pf-*` headers.
//!
//! A follow stream is one task feeding a channel body; it ends when the client closes. Never
//! touches the store after the pod lookup. Called by `api`.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::Value;

use crate::sim::api::{resolve_container, RequestInfo};
use crate::sim::body::SimBody;
use crate::sim::status::{base_response, finish, ApiError, Flow, ResponseCtx};
use crate::sim::store;

/// How many lines a pod has "written" before the request (without follow).
const INITIAL_LINES: u64 = 5;

fn line(namespace: &str, pod: &str, container: &str, n: u64, timestamps: bool) -> String {
    let text = format!("log line {n} from {namespace}/{pod} container {container}\n");
    if timestamps {
        format!(
            "{} {text}",
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
        )
    } else {
        text
    }
}

/// Serves the log of `pod`.
pub fn serve(info: &RequestInfo<'_>, pod: &Value) -> Result<Response<SimBody>, ApiError> {
    let container = resolve_container(pod, info.query.get("container"))?;
    if info.query.flag("previous") {
        // Sim containers never restart, so there is no previous instance to read.
        return Err(ApiError::bad_request(format!(
            "previous terminated container {container:?} in pod {:?} not found",
            pod["metadata"]["name"].as_str().unwrap_or("")
        )));
    }
    let namespace = store::meta_str(pod, "namespace");
    let name = store::meta_str(pod, "name");
    let timestamps = info.query.flag("timestamps");
    let follow = info.query.flag("follow");
    let first = match info
        .query
        .get("tailLines")
        .and_then(|t| t.parse::<u64>().ok())
    {
        Some(tail) => INITIAL_LINES.saturating_sub(tail) + 1,
        None => 1,
    };
    let ctx = ResponseCtx {
        flow: Flow::None,
        ..info.ctx
    };
    let builder = base_response(StatusCode::OK, Some("text/plain"), &ctx);
    let mut initial = String::new();
    for n in first..=INITIAL_LINES {
        initial.push_str(&line(&namespace, &name, &container, n, timestamps));
    }
    if !follow {
        return Ok(finish(builder, Bytes::from(initial)));
    }
    let (sender, body) = crate::sim::body::channel(4);
    let interval = info.member.tuning.log_interval;
    tokio::spawn(async move {
        if !initial.is_empty() && sender.send(Bytes::from(initial)).await.is_err() {
            return;
        }
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        let mut n = INITIAL_LINES;
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    n += 1;
                    let chunk = Bytes::from(line(&namespace, &name, &container, n, timestamps));
                    if sender.send(chunk).await.is_err() {
                        break;
                    }
                }
                _ = sender.closed() => break,
            }
        }
    });
    builder
        .body(body)
        .map_err(|e| ApiError::status(500, "InternalError", e.to_string()))
}
