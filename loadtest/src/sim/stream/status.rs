//! Kubernetes `Status` documents of the streaming subresources: the HTTP error answered instead of
//! a 101 (bad upgrade, no protocol in common), and the exit status a session writes on its error
//! stream (v4/v5 remote-command protocol), which kubectl turns into its own exit code.
//!
//! Only this module spells these JSON documents; `stream::exec` and `stream` call it. It never
//! does I/O.

use serde_json::json;

use crate::sim::body::{self, SimBody};

/// How a simulated process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProcessExit {
    /// The process ran and exited with this code (0 is success).
    Code(i32),
    /// The process could not be started (e.g. unknown executable); the message is what the
    /// container runtime would report.
    StartFailed(String),
}

/// The exit status written on the error stream by the v4 and v5 protocols.
pub(crate) fn exit_status_v4(exit: &ProcessExit) -> Vec<u8> {
    let doc = match exit {
        ProcessExit::Code(0) => json!({"metadata": {}, "status": "Success"}),
        ProcessExit::Code(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command [...], exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        ProcessExit::StartFailed(message) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: error executing command in container: {message}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": format!("error executing command in container: {message}")}]},
            "code": 500,
        }),
    };
    doc.to_string().into_bytes()
}

/// The error stream content of the older protocols (v1 to v3): plain text, nothing on success.
pub(crate) fn exit_status_text(exit: &ProcessExit) -> Vec<u8> {
    match exit {
        ProcessExit::Code(0) => Vec::new(),
        ProcessExit::Code(code) => {
            format!("command terminated with non-zero exit code: exit status {code}").into_bytes()
        }
        ProcessExit::StartFailed(message) => message.clone().into_bytes(),
    }
}

/// A Status error response (instead of 101) with the given HTTP code and reason.
pub(crate) fn error_response(
    code: hyper::StatusCode,
    reason: &str,
    message: &str,
) -> hyper::Response<SimBody> {
    let doc = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut resp = hyper::Response::new(body::full(doc.to_string()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// 400 BadRequest Status.
pub(crate) fn bad_request(message: &str) -> hyper::Response<SimBody> {
    error_response(hyper::StatusCode::BAD_REQUEST, "BadRequest", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_zero_exit_carries_the_code_as_an_exit_code_cause() {
        let doc: serde_json::Value =
            serde_json::from_slice(&exit_status_v4(&ProcessExit::Code(3))).unwrap();
        assert_eq!(doc["status"], "Failure");
        assert_eq!(doc["reason"], "NonZeroExitCode");
        assert_eq!(doc["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(doc["details"]["causes"][0]["message"], "3");
    }

    #[test]
    fn success_is_a_bare_success_status() {
        assert_eq!(
            exit_status_v4(&ProcessExit::Code(0)),
            br#"{"metadata":{},"status":"Success"}"#
        );
    }
}
