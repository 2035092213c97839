//! The headers of a POST or GET: the configured ones, `headers_helper`'s
//! (run when first needed and again after a 401/403), the 2025-era session
//! headers and the 2026-07-28 headers a body implies; and the scrubbing of
//! header values (secrets) out of any text of the server's. Knows nothing
//! of streams or of what an answer means.

#![forbid(unsafe_code)]

use std::io::Read;
use std::time::Duration;

use crate::config::check_header;
use crate::mcp::ArgScalars;

use super::post::Post;
use super::{modern, Shared};

/// How long `headers_helper` may run.
pub(super) const HELPER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a `headers_helper` may print: a JSON object of a few headers.
pub(super) const MAX_HELPER_OUTPUT: u64 = 64 * 1024;

/// Splits `Name: value` (the CLI's `--header`) at its first colon.
pub fn split_header(text: &str) -> Result<(String, String), String> {
    let Some((name, value)) = text.split_once(':') else {
        return Err("expected \"Name: value\"".into());
    };
    let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
    check_header(&name, &value)?;
    Ok((name, value))
}

/// A response header as text.
pub(super) fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Runs `headers_helper` with `sh -c` (`cmd /C` on Windows), within 10 s,
/// and reads the JSON object of headers it prints (at most
/// [`MAX_HELPER_OUTPUT`] bytes). Every value it printed joins the secrets
/// of this process (`redact::learn`). The error never quotes its output.
pub(super) fn run_helper(
    helper: &str,
    env: &[(String, String)],
    cwd: &Option<std::path::PathBuf>,
) -> Result<Vec<(String, String)>, String> {
    use std::process::{Command, Stdio};
    let (shell, flag) = if cfg!(windows) {
        ("cmd", "/C")
    } else {
        ("sh", "-c")
    };
    let mut cmd = Command::new(shell);
    cmd.arg(flag)
        .arg(helper)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // What it says on stderr could hold the secret it prints: dropped.
        .stderr(Stdio::null())
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let (tx, rx) = crossbeam_channel::bounded(1);
    crate::guard::spawn(
        "headers-helper",
        "headers_helper's output is not read",
        move || {
            let mut out = Vec::new();
            let _ = (&mut stdout)
                .take(MAX_HELPER_OUTPUT + 1)
                .read_to_end(&mut out);
            let _ = tx.send(out);
        },
        || {},
    )
    .map_err(|e| format!("cannot start its reader: {e}"))?;
    let out = match rx.recv_timeout(HELPER_TIMEOUT) {
        Ok(out) if out.len() as u64 > MAX_HELPER_OUTPUT => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "it printed more than {} KiB",
                MAX_HELPER_OUTPUT / 1024
            ));
        }
        Ok(out) => out,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "it did not finish within {}s",
                HELPER_TIMEOUT.as_secs()
            ));
        }
    };
    let status = child.wait().map_err(|e| format!("waiting for it: {e}"))?;
    if !status.success() {
        return Err(format!("it failed ({status})"));
    }
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&out)
        .map_err(|_| "it did not print a JSON object of headers".to_owned())?;
    // Secrets from now on, whatever follows: a value it printed may come
    // back in any text, even one this run does not use.
    crate::redact::learn(map.values().filter_map(|v| v.as_str()));
    let mut headers = Vec::new();
    for (name, value) in map {
        let Some(value) = value.as_str() else {
            return Err(format!("the value of header {name:?} is not a string"));
        };
        check_header(&name, value)?;
        headers.push((name, value.to_owned()));
    }
    Ok(headers)
}

impl Shared {
    /// The configured headers, then those of `headers_helper` (run the
    /// first time, or again when `refresh`).
    pub(super) fn headers(&self, refresh: bool) -> Vec<(String, String)> {
        let mut out = self.headers.clone();
        if let Some(helper) = &self.helper {
            let mut cached = self.helper_headers.lock();
            // One run at a time; the others wait for its result.
            while cached.running {
                self.helper_ran.wait(&mut cached);
            }
            if cached.last.is_none() || refresh {
                cached.running = true;
                drop(cached);
                self.run_helper_unlocked(helper);
                cached = self.helper_headers.lock();
            }
            for (name, value) in cached.last.iter().flatten() {
                out.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                out.push((name.clone(), value.clone()));
            }
        }
        out
    }

    /// Runs `headers_helper` (marked running by the caller) with no lock
    /// held, then keeps what it printed and marks it done in one step,
    /// however the run ends.
    fn run_helper_unlocked(&self, helper: &str) {
        struct Done<'a>(&'a Shared, Option<Vec<(String, String)>>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut cached = self.0.helper_headers.lock();
                if let Some(ran) = self.1.take() {
                    cached.last = Some(ran);
                }
                cached.running = false;
                self.0.helper_ran.notify_all();
            }
        }
        let mut done = Done(self, None);
        done.1 = Some(
            match run_helper(helper, &self.helper_env, &self.helper_cwd) {
                Ok(h) => h,
                Err(why) => {
                    crate::warn!("headers_helper of {}: {why}", self.shown);
                    Vec::new()
                }
            },
        );
    }

    /// `req` with the protocol's `headers`, then the configured ones (and
    /// `headers_helper`'s, run again when `refresh`).
    pub(super) fn headed<B>(
        &self,
        mut req: ureq::RequestBuilder<B>,
        headers: Vec<(String, String)>,
        refresh: bool,
    ) -> ureq::RequestBuilder<B> {
        for (name, value) in headers.into_iter().chain(self.headers(refresh)) {
            req = req.header(name, value);
        }
        req
    }

    /// The 2025-era session headers: the session id and the negotiated
    /// version, once `initialize` set them.
    pub(super) fn session_headers(&self) -> Vec<(String, String)> {
        self.session.headers()
    }

    /// The headers a 2026-07-28 POST mirrors from its body: version,
    /// method, name and, for a `tools/call`, the arguments its tool's
    /// `x-mcp-header` annotations name, from the scalars of its arguments
    /// read with it (`mcp::ArgScalars`): its line is not read. A value
    /// left out for its size is not sent (the server's answer is
    /// relayed), said once per tool.
    pub(super) fn modern_headers(&self, post: &Post, version: &str) -> Vec<(String, String)> {
        let method = post.method.unwrap_or_default();
        let modern = post.out.modern();
        let name = modern.and_then(|m| m.name.as_deref());
        let mut out = modern::standard_headers(version, method, name);
        if let (Some(modern), Some(name), "tools/call") = (modern, name, method) {
            let map = self.tool_headers.lock().get(name).cloned();
            if let Some(map) = map.filter(|m| !m.is_empty()) {
                let (headers, left_out) = modern::param_headers(&map, &modern.arguments);
                out.extend(headers);
                if !left_out.is_empty() && self.warned_left_out.lock().insert(name.to_owned()) {
                    crate::warn!(
                        "{}: a call of tool {name:?} is sent without header {}: its argument is longer than {} KiB or beyond the {} KiB of arguments kept for headers (further ones are not logged)",
                        self.shown,
                        left_out.iter().map(|t| format!("Mcp-Param-{t}")).collect::<Vec<_>>().join(", "),
                        ArgScalars::MAX_SCALAR >> 10,
                        ArgScalars::MAX_TOTAL >> 10,
                    );
                }
            }
        }
        out
    }

    /// `text` with every header value in it replaced, and every word of
    /// one that could be a secret on its own (the token of `Bearer TOKEN`).
    pub(super) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let helper = self.helper_headers.lock().last.clone().unwrap_or_default();
        for (_, value) in self.headers.iter().chain(helper.iter()) {
            let words = value.split_whitespace().filter(|w| w.len() >= 8);
            for secret in std::iter::once(value.as_str()).chain(words) {
                if secret.len() >= 4 {
                    text = text.replace(secret, "[redacted]");
                }
            }
        }
        // Copies of them in another case, URL-encoded or in base64.
        let values: Vec<(String, String)> = self
            .headers
            .iter()
            .chain(helper.iter())
            .map(|(_, v)| ("header-secret".to_owned(), v.clone()))
            .collect();
        crate::redact::Redactor::new(&values).redact_secrets(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_split_at_the_first_colon() {
        assert_eq!(
            split_header("Authorization: Bearer a:b"),
            Ok(("Authorization".into(), "Bearer a:b".into()))
        );
        assert!(split_header("no colon").is_err());
        assert!(split_header("bad name: x").is_err());
    }

    #[test]
    fn header_checks_never_quote_the_value() {
        let err = check_header("X-Key", "sec\r\nret").unwrap_err();
        assert!(!err.contains("sec"), "{err}");
    }
}
