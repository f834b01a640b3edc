//! Reading kubectl's `-v=8` log of a streaming command: did it really switch to the protocol it
//! was asked for? kubectl falls back from WebSocket to SPDY silently when a WebSocket upgrade
//! fails, so a test that only checks the command's output would pass over the wrong protocol.
//! Used by the sim's own stream tests and by the gateway's, which run the same commands through
//! the gateway. Never used by the server.

/// What kubectl logs for the 101 of `protocol` ("websocket" or "spdy"), for exec/attach or
/// port-forward.
fn expected_101_headers(protocol: &str, port_forward: bool) -> &'static [&'static str] {
    match (protocol, port_forward) {
        ("websocket", false) => &[
            "Upgrade: websocket",
            "Sec-Websocket-Protocol: v5.channel.k8s.io",
        ],
        ("websocket", true) => &[
            "Upgrade: websocket",
            "Sec-Websocket-Protocol: SPDY/3.1+portforward.k8s.io",
        ],
        (_, false) => &[
            "Upgrade: SPDY/3.1",
            "X-Stream-Protocol-Version: v4.channel.k8s.io",
        ],
        (_, true) => &[
            "Upgrade: SPDY/3.1",
            "X-Stream-Protocol-Version: portforward.k8s.io",
        ],
    }
}

/// Checks that kubectl's `-v=8` log shows a 101 with the response headers of `protocol`; the
/// error says what is missing, with the part of the log that was read.
pub fn kubectl_switched(log: &str, protocol: &str, port_forward: bool) -> Result<(), String> {
    // Only the response headers count: the request carries the same names.
    let Some(at) = log.find("101 Switching Protocols") else {
        return Err(format!("no 101 over {protocol}:\n{log}"));
    };
    let response = log[at..].lines().take(8).collect::<Vec<_>>().join("\n");
    match expected_101_headers(protocol, port_forward)
        .iter()
        .find(|header| !response.contains(*header))
    {
        Some(header) => Err(format!(
            "{header:?} missing from the 101 over {protocol}:\n{response}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::kubectl_switched;

    const SPDY_101: &str = "I1122 POST https://gw/exec 101 Switching Protocols in 3 milliseconds\n\
        I1122 Response Headers:\nI1122     Connection: Upgrade\nI1122     Upgrade: SPDY/3.1\n\
        I1122     X-Stream-Protocol-Version: v4.channel.k8s.io\n";

    #[test]
    fn a_silent_fallback_to_spdy_is_caught() {
        assert!(kubectl_switched(SPDY_101, "spdy", false).is_ok());
        let err = kubectl_switched(SPDY_101, "websocket", false).unwrap_err();
        assert!(err.contains("Upgrade: websocket"), "{err}");
        assert!(
            kubectl_switched(SPDY_101, "spdy", true).is_err(),
            "exec is not port-forward"
        );
        assert!(kubectl_switched("GET /api 200 OK", "spdy", false)
            .unwrap_err()
            .starts_with("no 101"));
    }
}
