//! exec and port-forward with kube-rs (its WebSocket client: `v5`/`v4.channel.k8s.io` for exec,
//! the channel protocol for port-forward) against a simulated member: output, stdin close,
//! exit status and echoed bytes, as a kube-rs user would check them.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{kube_client, TestFleet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Runs `test` on a new one-member fleet's runtime, with kube-rs's `Api` of member 1's pods in
/// `default`.
fn with_pods<F: Future<Output = ()>>(test: impl FnOnce(Api<Pod>) -> F) {
    let fleet = TestFleet::start(1);
    let kubeconfig = fleet.kubeconfig();
    fleet.runtime.block_on(async move {
        test(Api::namespaced(kube_client(&kubeconfig).await, "default")).await
    });
}

#[test]
fn kube_rs_exec_pipes_stdin_and_reports_the_exit_status() {
    with_pods(|pods| async move {
        let params = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true);
        let mut process = tokio::time::timeout(
            Duration::from_secs(20),
            pods.exec("hello", ["sh", "-c", "cat; echo done >&2; exit 2"], &params),
        )
        .await
        .expect("exec in time")
        .expect("exec");
        let mut stdin = process.stdin().expect("stdin");
        let mut stdout = process.stdout().expect("stdout");
        let mut stderr = process.stderr().expect("stderr");
        let status = process.take_status().expect("status");
        stdin.write_all(b"from kube-rs\n").await.unwrap();
        // Closing stdin reaches `cat` as EOF (v5 close signal).
        stdin.shutdown().await.unwrap();
        drop(stdin);
        let mut out = String::new();
        let mut err = String::new();
        let read_all = async {
            stdout.read_to_string(&mut out).await.unwrap();
            stderr.read_to_string(&mut err).await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(20), read_all)
            .await
            .expect("output in time");
        assert_eq!(out, "from kube-rs\n");
        assert_eq!(err, "done\n");
        let status = tokio::time::timeout(Duration::from_secs(20), status)
            .await
            .expect("status in time")
            .expect("a status");
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
        let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
        assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
        assert_eq!(causes[0].message.as_deref(), Some("2"));
        process.join().await.expect("join");
    });
}

#[test]
fn kube_rs_port_forward_echoes_on_each_port() {
    with_pods(|pods| async move {
        let mut forwarder = tokio::time::timeout(
            Duration::from_secs(20),
            pods.portforward("hello", &[8080, 9090]),
        )
        .await
        .expect("port-forward in time")
        .expect("port-forward");
        for port in [8080u16, 9090] {
            let mut stream = forwarder.take_stream(port).expect("stream for the port");
            let payload = format!("hello on {port}").repeat(1000);
            stream.write_all(payload.as_bytes()).await.unwrap();
            let mut echoed = vec![0u8; payload.len()];
            tokio::time::timeout(Duration::from_secs(20), stream.read_exact(&mut echoed))
                .await
                .expect("echo in time")
                .expect("echo");
            assert_eq!(echoed, payload.as_bytes(), "port {port}");
        }
        forwarder.abort();
    });
}
