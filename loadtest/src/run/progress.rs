//! The driver's progress bar: one bar per target, filled by elapsed time against the time the
//! scenario is expected to take. Drawn on stderr only when stderr is a terminal (indicatif hides
//! it otherwise), so a script's logs and the table on stdout stay clean. Never measures anything.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar of the target being measured; ticks on its own until [`TargetProgress::finish`].
pub struct TargetProgress {
    bar: ProgressBar,
}

impl TargetProgress {
    pub fn start(target: &str, scenario: &str, expected: Duration) -> TargetProgress {
        let millis = expected.as_millis().max(1) as u64;
        let bar = ProgressBar::with_draw_target(Some(millis), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix:>16} {msg:<14} [{bar:30}] {elapsed:>4} / ~{duration}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(target.to_owned());
        bar.set_message(scenario.to_owned());
        // Elapsed time fills the bar: the scenarios run for a fixed duration, not a fixed count.
        if bar.is_hidden() {
            return TargetProgress { bar };
        }
        let ticker = bar.clone();
        let started = std::time::Instant::now();
        std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                while !ticker.is_finished() {
                    ticker.set_position((started.elapsed().as_millis() as u64).min(millis));
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .ok();
        TargetProgress { bar }
    }

    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for TargetProgress {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}
