//! The server's own stream (the 2025-era GET after
//! `notifications/initialized`), re-opened with backoff, and the session's
//! end (`DELETE`). Knows nothing of requests' answers.

#![forbid(unsafe_code)]

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;

use super::order::Turn;
use super::stream::note_last_id;
use super::{classify, resume, sse, Shared};

/// The GET stream's reconnection delays: 1 s, growing ×1.5, at most 30 s.
pub(super) const GET_RETRY_FIRST: Duration = Duration::from_secs(1);

pub(super) const GET_RETRY_MAX: Duration = Duration::from_secs(30);

/// The shortest wait before the GET stream is opened again, whatever its
/// `retry` (`retry: 0` must not make a busy loop).
pub(super) const GET_RETRY_MIN: Duration = resume::RETRY_MIN;

/// How long the GET stream waits before it is opened again after it
/// ended: its `retry`, at least [`GET_RETRY_MIN`], or [`GET_RETRY_FIRST`].
pub(super) fn get_wait(retry: Option<Duration>) -> Duration {
    retry.map_or(GET_RETRY_FIRST, |r| r.max(GET_RETRY_MIN))
}

impl Shared {
    /// Starts the thread that keeps the server's own stream open.
    pub(super) fn start_get_stream(self: &Arc<Shared>, turn: Option<Turn>) {
        if !self.session.begin_get() {
            // Already open: nothing to wait for (`turn` is let go).
            return;
        }
        let shared = self.clone();
        let spawned = self.spawn("http-get", move || shared.get_loop(turn));
        if let Err(e) = spawned {
            crate::warn!(
                "cannot start the thread for the stream of {}: {e}",
                self.shown
            );
        }
    }

    /// Ends the session: DELETE with its id and negotiated version, as
    /// every request after `initialize`, within `step` (405 and other
    /// refusals are fine).
    pub(super) fn delete_session(&self, step: Duration) {
        if !self.session.has_id() {
            return;
        }
        let headers = self.session_headers();
        let req = self.headed(self.agent.delete(&self.url), headers, false);
        let result = req.config().timeout_global(Some(step)).build().call();
        if let Err(e) = result {
            crate::debug!(
                "ending the session with {}: {}",
                self.shown,
                self.scrub(&e.to_string())
            );
        }
    }

    /// The GET stream: open, read, wait, open again, until the connection
    /// closes or the server has none (405) or the session ends.
    pub(super) fn get_loop(&self, mut turn: Option<Turn>) {
        let mut delay = GET_RETRY_FIRST;
        let mut last_id: Option<String> = None;
        // `headers_helper` is run again once after a 401 or 403, as for a
        // POST; a stream opened resets that.
        let (mut refresh, mut refreshed) = (false, false);
        while !self.is_closed() {
            let mut headers = self.session_headers();
            headers.push(("Accept".to_owned(), "text/event-stream".to_owned()));
            if let Some(id) = &last_id {
                headers.push(("Last-Event-ID".to_owned(), id.clone()));
            }
            let req = self.headed(self.agent.get(&self.url), headers, refresh);
            refresh = false;
            let mut wait = delay;
            let answer = req.call();
            // Opened (or refused): what was sent after `initialized` goes.
            if let Some(t) = turn.take() {
                t.release();
            }
            match answer {
                Ok(resp) if resp.status().as_u16() == 405 => {
                    crate::debug!("{} has no stream of its own (405)", self.shown);
                    return;
                }
                Ok(resp)
                    if matches!(resp.status().as_u16(), 401 | 403)
                        && self.helper.is_some()
                        && !refreshed =>
                {
                    crate::info!(
                        "{} answered its stream {}; running headers_helper again",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                    (refresh, refreshed) = (true, true);
                    continue;
                }
                Ok(resp) if matches!(resp.status().as_u16(), 404 | 400 | 401 | 403) => {
                    crate::debug!(
                        "{} refused its stream: {}",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                    return;
                }
                Ok(resp) if resp.status().is_success() => {
                    refreshed = false;
                    let mut parser_retry = None;
                    let reader = resp.into_body().into_reader();
                    let result = self.read_get_stream(reader, &mut last_id, &mut parser_retry);
                    if let Err(e) = result {
                        crate::debug!(
                            "{}: its stream broke ({})",
                            self.shown,
                            self.scrub(&e.to_string())
                        );
                    }
                    delay = GET_RETRY_FIRST;
                    wait = get_wait(parser_retry);
                }
                Ok(resp) => {
                    crate::debug!(
                        "{} answered its stream with {}",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                }
                Err(e) => {
                    crate::debug!(
                        "{}: opening its stream failed ({})",
                        self.shown,
                        self.scrub(&e.to_string())
                    );
                }
            }
            match self.stopped.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            delay = (delay.mul_f64(1.5)).min(GET_RETRY_MAX);
        }
    }

    pub(super) fn read_get_stream(
        &self,
        reader: impl Read,
        last_id: &mut Option<String>,
        retry: &mut Option<Duration>,
    ) -> std::io::Result<()> {
        let mut moved = 0;
        self.read_events(reader, |parser, items| {
            *retry = parser.retry();
            note_last_id(parser, last_id, &self.shown, &mut moved);
            if self.is_closed() {
                return Some(());
            }
            for item in items {
                if let sse::Item::Event(e) = item {
                    if e.kind == "message" {
                        self.deliver(e.data, None);
                    }
                }
            }
            None
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_get_stream_waits_its_retry_but_never_less_than_the_floor() {
        assert_eq!(get_wait(Some(Duration::ZERO)), GET_RETRY_MIN);
        assert_eq!(get_wait(Some(Duration::from_millis(10))), GET_RETRY_MIN);
        let long = Duration::from_millis(2500);
        assert_eq!(get_wait(Some(long)), long);
        assert_eq!(get_wait(None), GET_RETRY_FIRST);
    }
}
