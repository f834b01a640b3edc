//! Running the real kubectl (/usr/bin/kubectl) against the gateway: a command with the
//! kubeconfig and context set, its output captured, and the checks every kubectl test makes.
//!
//! It never talks to a member directly and never retries. Used by the kubectl, kubectl_streams,
//! reload, drain, identity, egress_proxy, one_pass and audit test binaries.

use std::path::Path;
use std::process::{Command, Output};

/// `kubectl --kubeconfig KUBECONFIG --context CONTEXT`, to add arguments to. No request
/// timeout: streaming sessions (exec, port-forward, watches) set their own bounds.
pub fn kubectl_command(kubeconfig: &Path, context: &str) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", context]);
    command
}

/// Runs `kubectl ... ARGS` with a 20 s request timeout; its output, whatever the exit code.
pub fn kubectl(kubeconfig: &Path, context: &str, args: &[&str]) -> Output {
    kubectl_command(kubeconfig, context)
        .args(["--request-timeout", "20s"])
        .args(args)
        .output()
        .unwrap()
}

/// The stdout of a kubectl run that must have succeeded; `context` goes into the failure
/// message (the gateway log, usually).
pub fn succeeded(out: Output, what: &str, context: &str) -> String {
    assert!(
        out.status.success(),
        "kubectl {what} failed ({}): {}\n{context}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
