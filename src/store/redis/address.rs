//! Where a Redis store is: `redis://[user[:password]@]host[:port][/db]`
//! or `rediss://…` (TLS), read into an [`Address`], and how it is shown
//! (the password never is: `redis://user:[redacted]@host:6379`).
//!
//! Owns the URL's grammar, what is refused in it (Sentinel and Cluster
//! schemes, options after `?` or `#`, a port or database that is not a
//! number) and the redacted form every log line, error, `status` and
//! `check` uses. An error never quotes the URL (it may hold a password).
//! It must not know how a connection is made (`store/redis.rs`).

#![forbid(unsafe_code)]

use std::fmt;

/// Redis's port when the URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// A Redis store's address, read from `store:`.
#[derive(Clone, PartialEq, Eq)]
pub struct Address {
    /// `rediss://`: TLS.
    pub tls: bool,
    pub user: Option<String>,
    /// Never shown: [`Address`]'s `Display` and `Debug` redact it.
    pub password: Option<String>,
    /// A name or an IP address (an IPv6 one without its brackets).
    pub host: String,
    pub port: u16,
    pub db: i64,
}

impl Address {
    /// Whether `value` is meant as a Redis address (so a bad one is
    /// refused as such, not as an unknown store).
    pub fn looks_like(value: &str) -> bool {
        let scheme = value.split("://").next().unwrap_or("").to_ascii_lowercase();
        value.contains("://")
            && (scheme.starts_with("redis")
                || scheme.starts_with("valkey")
                || scheme.contains("sentinel")
                || scheme.contains("cluster"))
    }

    /// Reads `url`; the error says what is wrong without quoting it.
    pub fn parse(url: &str) -> Result<Address, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or("a Redis store is redis://host:port or rediss://host:port")?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "redis" => false,
            "rediss" => true,
            s if s.contains("sentinel") => {
                return Err(
                    "Redis Sentinel is not supported; give the primary's address \
                    (redis://host:port)"
                        .into(),
                )
            }
            s if s.contains("cluster") => {
                return Err(
                    "Redis Cluster is not supported; give a standalone server's or a \
                    managed primary endpoint's address (redis://host:port)"
                        .into(),
                )
            }
            _ => return Err("a Redis store is redis://host:port or rediss://host:port".into()),
        };
        if rest.contains(['?', '#']) {
            return Err("options in a Redis URL (after ? or #) are not supported".into());
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (mut user, mut password) = (None, None);
        if let Some(info) = userinfo {
            let (u, p) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            let decode = |s: &str, what: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|s| s.into_owned())
                    .map_err(|_| format!("the {what} in the Redis URL is not UTF-8 once decoded"))
            };
            if !u.is_empty() {
                user = Some(decode(u, "user name")?);
            }
            if let Some(p) = p {
                password = Some(decode(p, "password")?);
            }
        }
        let (host, port) = split_host_port(hostport)?;
        let db = match path {
            "" => 0,
            p => p
                .parse::<u32>()
                .map_err(|_| "the database in a Redis URL is a number (redis://host:port/0)")?
                .into(),
        };
        Ok(Address {
            tls,
            user,
            password,
            host,
            port,
            db,
        })
    }
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address in a Redis URL needs its closing ]")?;
        (h, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("a Redis URL names no host".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or("the port in a Redis URL is a number from 1 to 65535")?,
    };
    Ok((host.to_owned(), port))
}

/// The address as it may be shown: the password is `[redacted]`.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.user, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:[redacted]@")?,
            (None, Some(_)) => f.write_str(":[redacted]@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_with_their_defaults() {
        let a = Address::parse("redis://cache.internal").unwrap();
        assert_eq!(
            (a.tls, a.host.as_str(), a.port, a.db),
            (false, "cache.internal", 6379, 0)
        );
        assert_eq!(a.to_string(), "redis://cache.internal:6379");
        let a = Address::parse("rediss://ops:p%40ss:w@10.0.0.7:6380/3").unwrap();
        assert!(a.tls);
        assert_eq!(a.user.as_deref(), Some("ops"));
        assert_eq!(a.password.as_deref(), Some("p@ss:w"));
        assert_eq!((a.host.as_str(), a.port, a.db), ("10.0.0.7", 6380, 3));
        let a = Address::parse("redis://:only@[::1]:7000/").unwrap();
        assert_eq!(
            (a.user.as_deref(), a.password.as_deref()),
            (None, Some("only"))
        );
        assert_eq!((a.host.as_str(), a.port), ("::1", 7000));
    }

    #[test]
    fn the_password_is_never_shown() {
        for url in [
            "redis://u:hunter2@h:1/2",
            "rediss://:hunter2@h",
            "redis://u:hunter2@[::1]:5",
        ] {
            let a = Address::parse(url).unwrap();
            let shown = format!("{a} {a:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("[redacted]"), "{shown}");
        }
        assert_eq!(
            Address::parse("redis://u:hunter2@h:1/2")
                .unwrap()
                .to_string(),
            "redis://u:[redacted]@h:1/2"
        );
    }

    #[test]
    fn sentinel_cluster_options_and_bad_parts_are_refused_without_quoting_the_url() {
        let cases = [
            ("redis+sentinel://u:hunter2@h:26379/mymaster", "Sentinel"),
            ("redis-sentinel://h", "Sentinel"),
            ("redis+cluster://h", "Cluster"),
            ("redis://u:hunter2@h:6379/?protocol=resp3", "options"),
            ("redis://u:hunter2@h:6379/#insecure", "options"),
            ("redis://u:hunter2@h:port", "port"),
            ("redis://u:hunter2@h:0", "port"),
            ("redis://u:hunter2@h/db1", "database"),
            ("redis://u:hunter2@", "no host"),
            ("redis://[::1:5", "closing"),
            ("http://u:hunter2@h", "redis://"),
        ];
        for (url, why) in cases {
            let e = Address::parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        assert!(Address::looks_like("redis+sentinel://h"));
        assert!(Address::looks_like("rediss://h"));
        assert!(!Address::looks_like("local"));
        assert!(!Address::looks_like("foo://x"));
    }
}
