//! The log every `fleetgate` command writes to stderr, and how a command line chooses it:
//! `--log-level LEVEL` and `--log-format text|json`, global flags of the binary (given before or
//! after the command). Also how a user error is printed when a command fails: one line (the error
//! and its causes, `a: b: c`), never a backtrace, which is for bugs (panics) alone.
//!
//! Which filter applies: `--log-level` when given (it wins: a command line is more deliberate than
//! an environment a shell profile may set), else `RUST_LOG` (tracing's directives, e.g.
//! `fleetgate=debug,h2=info`), else `info`. `demo` passes both flags on to the commands it starts
//! (`serve`, `agent`) and only the format to the simulated fleet (docs/gateway.md, "Logs").
//!
//! Called once by the binary (`main.rs`) before the command runs; never by the library.

use std::io::IsTerminal;

/// The logging flags, global to every command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// The most detailed level logged, for every module (wins over RUST_LOG, which takes
    /// per-module directives when this is absent; default: info).
    #[arg(long, global = true, value_enum, value_name = "LEVEL")]
    pub log_level: Option<LogLevel>,
    /// `text` (one human-readable line per event) or `json` (one JSON object per line: timestamp,
    /// level, target, message and the event's fields, for a log collector).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A level of `--log-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// The format of `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogArgs {
    /// The flags as a command line gives them, for a `fleetgate` child process (`demo` starts
    /// `serve` and `agent`), so the child logs as its parent was asked to.
    pub fn child_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(level) = self.log_level {
            args.push(format!("--log-level={}", value_name(level)));
        }
        args.push(format!("--log-format={}", self.format_name()));
        args
    }

    /// `text` or `json`, as `--log-format` takes it (for `fleetgate-loadtest`, which has the same
    /// flag).
    pub fn format_name(&self) -> String {
        value_name(self.log_format)
    }

    /// The filter: `--log-level`, else `RUST_LOG`, else `info`.
    fn filter(&self) -> tracing_subscriber::EnvFilter {
        use tracing_subscriber::EnvFilter;
        match self.log_level {
            Some(level) => EnvFilter::new(value_name(level)),
            None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        }
    }

    /// Installs the process's log subscriber (stderr). Colours only on a terminal, so a log
    /// written to a file stays greppable (`peer=ADDR`).
    pub fn init(&self) {
        let builder = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(self.filter());
        match self.log_format {
            LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
            // The event's fields beside `message` at the top level (`{"level":"INFO",
            // "message":"tunnel up","cluster":"member3",...}`), as collectors index them.
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .init(),
        }
    }

    /// Reports the error a command ended with, on stderr: `Error: what: why` on one line (text),
    /// or one JSON event (json). anyhow's `{:?}` would add a `Caused by:` list and, with
    /// RUST_BACKTRACE set, a backtrace of where the error was made: noise for a user error.
    pub fn report_error(&self, error: &anyhow::Error) {
        let message = format!("{error:#}");
        match self.log_format {
            LogFormat::Text => eprintln!("Error: {}", one_line(&message)),
            LogFormat::Json => tracing::error!(error = %one_line(&message), "fleetgate failed"),
        }
    }
}

/// A message with its line breaks (a YAML error quoting its input, say) folded, so that the
/// report stays one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The name clap gives a value on the command line (`json`, `debug`).
fn value_name(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_args_repeat_what_was_asked() {
        let args = LogArgs {
            log_level: Some(LogLevel::Debug),
            log_format: LogFormat::Json,
        };
        assert_eq!(
            args.child_args(),
            vec!["--log-level=debug", "--log-format=json"]
        );
        assert_eq!(LogArgs::default().child_args(), vec!["--log-format=text"]);
    }

    #[test]
    fn a_reported_error_is_one_line() {
        assert_eq!(one_line("bad: line 1\n  key: x\n"), "bad: line 1 key: x");
    }
}
