//! The requests to stop that come from outside, as signal numbers on a
//! thread of their own: SIGTERM, SIGINT and SIGHUP on Unix; on Windows the
//! console's Ctrl-C (as SIGINT, 2), Ctrl-Break (as SIGTERM, 15) and the
//! closing of the console, a logoff or a shutdown (as SIGHUP, 1), so that
//! both end a session the same way and with the same exit code (128 + n).
//! Knows nothing of what a signal leads to.

use anyhow::{Context, Result};
use std::thread;

/// SIGTERM's number (Ctrl-Break's on Windows).
const SIGTERM: i32 = 15;

/// Starts the `signals` thread, which calls `on_signal` with each signal
/// caught until it returns false.
pub fn watch(mut on_signal: impl FnMut(i32) -> bool + Send + 'static) -> Result<()> {
    let signals = sys::Signals::new().context("installing signal handlers")?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let caught = crate::guard::catch(|| {
                for sig in signals.forever() {
                    if !on_signal(sig) {
                        return;
                    }
                }
            });
            // A bug while a stop was asked for (this thread has nothing
            // else to do): the session stops as on SIGTERM.
            if let Err(p) = caught {
                p.report("signals are no longer caught; stopping as on SIGTERM");
                if let Err(p) = crate::guard::catch(|| on_signal(SIGTERM)) {
                    p.report("the stop was not reported");
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

#[cfg(unix)]
mod sys {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

    pub struct Signals(signal_hook::iterator::Signals);

    impl Signals {
        pub fn new() -> std::io::Result<Signals> {
            signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]).map(Signals)
        }

        pub fn forever(mut self) -> impl Iterator<Item = i32> {
            std::iter::from_fn(move || self.0.forever().next())
        }
    }
}

#[cfg(windows)]
mod sys {
    use std::time::Duration;

    use crossbeam_channel::{Receiver, Sender};
    use parking_lot::Mutex;
    use windows_sys::core::BOOL;
    use windows_sys::Win32::System::Console::{
        SetConsoleCtrlHandler, CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_C_EVENT, CTRL_LOGOFF_EVENT,
        CTRL_SHUTDOWN_EVENT,
    };

    /// Where the console handler sends what it caught (one per watcher).
    static WATCHERS: Mutex<Vec<Sender<i32>>> = Mutex::new(Vec::new());

    /// How long the handler holds back the end of the process after a
    /// console close, a logoff or a shutdown: Windows ends the process when
    /// the handler returns (and by itself some seconds later), and the
    /// session needs the time to stop its server.
    const CLOSE_GRACE: Duration = Duration::from_secs(4);

    pub struct Signals(Receiver<i32>);

    impl Signals {
        pub fn new() -> std::io::Result<Signals> {
            let (tx, rx) = crossbeam_channel::unbounded();
            let mut watchers = WATCHERS.lock();
            if watchers.is_empty() {
                // SAFETY: a plain function pointer that lives forever.
                if unsafe { SetConsoleCtrlHandler(Some(handler), 1) } == 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            watchers.push(tx);
            Ok(Signals(rx))
        }

        pub fn forever(self) -> impl Iterator<Item = i32> {
            self.0.into_iter()
        }
    }

    /// The signal number a console control event stands for.
    pub fn signal_of(ctrl: u32) -> Option<i32> {
        match ctrl {
            CTRL_C_EVENT => Some(2),
            CTRL_BREAK_EVENT => Some(15),
            CTRL_CLOSE_EVENT | CTRL_LOGOFF_EVENT | CTRL_SHUTDOWN_EVENT => Some(1),
            _ => None,
        }
    }

    /// Runs on a thread Windows starts for each event.
    unsafe extern "system" fn handler(ctrl: u32) -> BOOL {
        let Some(sig) = signal_of(ctrl) else {
            return 0;
        };
        WATCHERS.lock().retain(|tx| tx.send(sig).is_ok());
        if sig == 1 {
            std::thread::sleep(CLOSE_GRACE);
        }
        1
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn console_events_stand_for_the_unix_signals() {
            assert_eq!(signal_of(CTRL_C_EVENT), Some(2));
            assert_eq!(signal_of(CTRL_BREAK_EVENT), Some(15));
            assert_eq!(signal_of(CTRL_CLOSE_EVENT), Some(1));
            assert_eq!(signal_of(CTRL_SHUTDOWN_EVENT), Some(1));
            assert_eq!(signal_of(99), None);
        }
    }
}
