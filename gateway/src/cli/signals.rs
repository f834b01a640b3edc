//! SIGINT and SIGTERM for the long-running commands (`serve`, `demo`): caught from the moment
//! [`Signals::install`] returns, so a signal sent as soon as a command reports `ready` (or while
//! it starts) is handled by the command rather than ending the process with the default action.

/// The two stop signals, with the runtime that waits for them.
pub struct Signals {
    pub runtime: tokio::runtime::Runtime,
    pub interrupt: tokio::signal::unix::Signal,
    pub terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (interrupt, terminate) = {
            let _entered = runtime.enter();
            (
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            )
        };
        Ok(Self {
            runtime,
            interrupt,
            terminate,
        })
    }
}
