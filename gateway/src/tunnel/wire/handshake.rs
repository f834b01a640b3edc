//! What a tunnel says before h2, on both ends. The agent's certificate names the cluster it
//! serves ([`AgentSubject`]: CN = the cluster, O = [`AGENT_ORGANIZATION`]); after TLS the agent
//! sends one hello line naming that cluster ([`hello`]), and the gateway answers one line: `OK`,
//! or `REFUSED` and why ([`HelloAnswer`]). Both lines are read with [`read_line`], a byte at a
//! time so that no h2 byte after the line is consumed, and at most [`MAX_HELLO`] bytes.
//!
//! The gateway reads a stranger's hello (one who passed mTLS only) and the agent reads the
//! gateway's answer: bounded, ASCII, and never a panic.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{is_cluster_name, printable, AGENT_ORGANIZATION};

/// The hello's first word, and its longest accepted length (with the cluster name, without the
/// `\n`).
const HELLO_PREFIX: &str = "FLEETGATE-TUNNEL/1 ";
pub const MAX_HELLO: usize = 300;

/// The gateway's answer to an accepted hello.
pub const HELLO_OK: &str = "OK\n";
/// The prefix of a refusal; the rest of the line says why.
pub const HELLO_REFUSED: &str = "REFUSED ";

/// The hello line an agent serving `cluster` sends.
pub fn hello(cluster: &str) -> String {
    format!("{HELLO_PREFIX}{cluster}\n")
}

/// The cluster a hello line names (without its `\n`), or why it is refused.
pub fn parse_hello(line: &[u8]) -> Result<&str, &'static str> {
    let line = std::str::from_utf8(line).map_err(|_| "the hello is not UTF-8")?;
    let cluster = line
        .strip_prefix(HELLO_PREFIX)
        .ok_or("the hello does not start with FLEETGATE-TUNNEL/1")?;
    if !is_cluster_name(cluster) {
        return Err("the hello names no valid cluster");
    }
    Ok(cluster)
}

/// The gateway's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloAnswer {
    /// The tunnel is accepted: h2 follows.
    Ok,
    /// The tunnel is refused, and why (printable ASCII; the gateway then closes).
    Refused(String),
}

impl HelloAnswer {
    /// The line the gateway sends, with its `\n`.
    pub fn line(&self) -> String {
        match self {
            HelloAnswer::Ok => HELLO_OK.to_owned(),
            HelloAnswer::Refused(reason) => format!("{HELLO_REFUSED}{}\n", printable(reason)),
        }
    }

    /// The answer a line (without its `\n`) gives: anything but `OK` is a refusal, whose reason
    /// is the rest of a `REFUSED` line, or else the whole line, kept printable.
    pub fn parse(line: &[u8]) -> HelloAnswer {
        let line = String::from_utf8_lossy(line);
        if line == HELLO_OK.trim_end() {
            return HelloAnswer::Ok;
        }
        let reason = line.strip_prefix(HELLO_REFUSED).unwrap_or(&line);
        HelloAnswer::Refused(printable(reason))
    }
}

/// Why no line was read.
#[derive(Debug)]
pub enum LineError {
    /// The connection ended or failed before the `\n`.
    Ended(std::io::Error),
    /// More than [`MAX_HELLO`] bytes came without a `\n`.
    TooLong,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::Ended(_) => f.write_str("the connection ended inside the line"),
            LineError::TooLong => write!(f, "the line is longer than {MAX_HELLO} bytes"),
        }
    }
}

impl std::error::Error for LineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LineError::Ended(error) => Some(error),
            LineError::TooLong => None,
        }
    }
}

/// One line (the hello, or its answer) without its `\n`: read a byte at a time, so the h2 bytes
/// after it stay unread, and at most [`MAX_HELLO`] bytes.
pub async fn read_line<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>, LineError> {
    let mut line = Vec::with_capacity(64);
    loop {
        let byte = stream.read_u8().await.map_err(LineError::Ended)?;
        if byte == b'\n' {
            return Ok(line);
        }
        if line.len() >= MAX_HELLO {
            return Err(LineError::TooLong);
        }
        line.push(byte);
    }
}

/// The subject of an agent's certificate, as both ends check it: the agent before it dials
/// (its `--cert` must be for its `--cluster`), the gateway after the TLS handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSubject {
    /// Its CNs (one that is not a string reads as empty).
    pub common_names: Vec<String>,
    /// Whether its O includes [`AGENT_ORGANIZATION`].
    pub is_agent: bool,
}

impl AgentSubject {
    /// The subject of a DER certificate, or `None` if it does not parse as X.509.
    pub fn parse(der: &[u8]) -> Option<AgentSubject> {
        let (_, parsed) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = parsed.subject();
        let common_names = subject
            .iter_common_name()
            .map(|n| n.as_str().unwrap_or_default().to_owned())
            .collect();
        let is_agent = subject
            .iter_organization()
            .any(|o| o.as_str() == Ok(AGENT_ORGANIZATION));
        Some(AgentSubject {
            common_names,
            is_agent,
        })
    }

    /// The cluster it may serve: its one CN, if it is an agent's; or why not.
    pub fn cluster(&self) -> Result<&str, String> {
        if !self.is_agent {
            return Err(format!(
                "the client certificate is not an agent's (no O={AGENT_ORGANIZATION})"
            ));
        }
        match self.common_names.as_slice() {
            [name] if !name.is_empty() => Ok(name),
            _ => Err("the agent certificate must have exactly one CN, the cluster's name".into()),
        }
    }
}
