//! What a failed host name lookup means: the name does not exist
//! (`EAI_NONAME`, an NXDOMAIN answer: someone must fix the URL), or the
//! lookup failed for now (`EAI_AGAIN`, no network, a resolver timeout:
//! waited for like a refused connection, as a laptop's Wi-Fi or VPN may
//! come up after the host starts).
//!
//! std keeps only the text of a `getaddrinfo` error on Unix
//! (`failed to lookup address information: ` and `gai_strerror`'s words,
//! which differ between glibc, musl and macOS), and the WSA code on
//! Windows; the text is compared with what this system's `gai_strerror`
//! says for `EAI_NONAME`. Knows nothing of HTTP or of the transport.

use std::io;

/// Whether `e`, from resolving a host name, says that the name does not
/// exist.
pub fn no_such_host(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        let text = e.to_string();
        text.strip_prefix("failed to lookup address information: ")
            .is_some_and(|detail| detail == gai_text(libc::EAI_NONAME))
    }
    #[cfg(windows)]
    {
        // WSAHOST_NOT_FOUND: "No such host is known" (WSATRY_AGAIN is
        // 11002).
        e.raw_os_error() == Some(11001)
    }
}

/// `gai_strerror(code)`, the words std puts in its error.
#[cfg(unix)]
fn gai_text(code: libc::c_int) -> String {
    // SAFETY: gai_strerror returns a pointer to a static NUL-terminated
    // string for any code (glibc, musl, the BSDs and macOS); it is only
    // read here.
    let text = unsafe { std::ffi::CStr::from_ptr(libc::gai_strerror(code)) };
    text.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::ToSocketAddrs;

    #[test]
    fn a_name_under_the_reserved_invalid_domain_does_not_exist() {
        // RFC 6761: resolvers answer NXDOMAIN for .invalid, with or
        // without a network.
        let e = "mcp-retry-test.invalid:80".to_socket_addrs().unwrap_err();
        assert!(no_such_host(&e), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_lookup_that_failed_for_now_is_not_read_as_a_missing_name() {
        for code in [libc::EAI_AGAIN, libc::EAI_FAIL, libc::EAI_MEMORY] {
            let e = io::Error::other(format!(
                "failed to lookup address information: {}",
                gai_text(code)
            ));
            assert!(!no_such_host(&e), "{e}");
        }
        let e = io::Error::other(format!(
            "failed to lookup address information: {}",
            gai_text(libc::EAI_NONAME)
        ));
        assert!(no_such_host(&e));
        assert!(!no_such_host(&io::Error::from(
            io::ErrorKind::ConnectionRefused
        )));
    }
}
