//! What the user sees while farout works: progress bars and messages.
//!
//! Library code never prints. Progress bars are indicatif bars on standard error, all children
//! of one [`MultiProgress`], so that a message never tears a bar apart. Messages go through the
//! [`log`] facade — `log::info!` for what a run is doing ("vocabulary: 46,914 words"),
//! `log::warn!` for what the user should know — and reach the terminal only if a logger is
//! installed: the `farout` binary installs [`StderrLogger`] (messages above the bars); a program
//! that embeds farout installs its own `log` logger, or none and stays silent.
//!
//! ```
//! farout_train::report::StderrLogger::install(log::LevelFilter::Info);
//! let bar = farout_train::report::progress_bar(false, 10, "{pos}/{len}");
//! log::info!("training starts");
//! bar.inc(10);
//! bar.finish();
//! ```

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::OnceLock;

/// The bars on the terminal; messages are printed while they are suspended.
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(MultiProgress::new)
}

/// A progress bar of `len` units drawn with `template` (indicatif syntax), or a hidden one
/// when `show` is false (`log.progress = false`).
pub fn progress_bar(show: bool, len: u64, template: &'static str) -> ProgressBar {
    let bar = if show {
        bars().add(ProgressBar::new(len))
    } else {
        ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
    };
    bar.set_style(ProgressStyle::with_template(template).expect("static template").progress_chars("=> "));
    bar
}

/// Prints farout's `log` records on standard error, above the progress bars: info records as
/// they are, warnings and errors with a `warning:` / `error:` prefix. Records of other crates
/// (dependencies log too) are dropped.
pub struct StderrLogger {
    level: log::LevelFilter,
}

impl StderrLogger {
    /// Installs the logger for records up to `level`; does nothing if a logger is installed.
    pub fn install(level: log::LevelFilter) {
        if log::set_boxed_logger(Box::new(Self { level })).is_ok() {
            log::set_max_level(level);
        }
    }
}

impl log::Log for StderrLogger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        meta.level() <= self.level && meta.target().starts_with("farout")
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = match record.level() {
            log::Level::Error => format!("error: {}", record.args()),
            log::Level::Warn => format!("warning: {}", record.args()),
            _ => record.args().to_string(),
        };
        bars().suspend(|| eprintln!("{line}"));
    }

    fn flush(&self) {}
}
