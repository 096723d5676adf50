//! A progress bar on standard error for work that runs longer than a second.
//!
//! Nothing is drawn for the first second, so short runs print nothing extra; on a terminal the
//! bar redraws in place, elsewhere (logs, CI) one line is written per tenth of the work.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const QUIET_FOR: Duration = Duration::from_secs(1);
const WIDTH: usize = 30;

pub struct Progress {
    label: String,
    start: Instant,
    terminal: bool,
    state: Mutex<State>,
}

struct State {
    drawn: bool,
    last_tenth: usize,
}

impl Progress {
    pub fn new(label: impl Into<String>) -> Self {
        Progress {
            label: label.into(),
            start: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
            state: Mutex::new(State {
                drawn: false,
                last_tenth: 0,
            }),
        }
    }

    /// Reports `done` of `total` units; safe to call from several threads.
    pub fn update(&self, done: usize, total: usize) {
        let elapsed = self.start.elapsed();
        if elapsed < QUIET_FOR || total == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let tenth = done * 10 / total;
        if !self.terminal && state.drawn && tenth == state.last_tenth {
            return;
        }
        state.drawn = true;
        state.last_tenth = tenth;
        let filled = done * WIDTH / total;
        let line = format!(
            "{} [{}{}] {done}/{total} {:.1} s",
            self.label,
            "#".repeat(filled),
            " ".repeat(WIDTH - filled),
            elapsed.as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Ends the bar's line if one was drawn.
    pub fn finish(&self) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.drawn && self.terminal {
            eprintln!();
        }
    }
}
