//! Windows: the equivalent of a 0700 directory. [`restrict`] gives a
//! directory a protected DACL (no ACE inherited from its parent) with one
//! ACE, full access for the current user, inherited by every file and
//! directory made in it: the status runtime directory's `<pid>.json` files,
//! the handshake cache's key and entries. Written with the raw
//! `windows-sys` bindings (SDDL in, a DACL out); the SDDL it sets is
//! [`sddl`], which the tests read back.
//!
//! Knows nothing of what the directory holds; `private_files::prepare_dir` calls
//! it after creating the directory (or finding it), every time, so a
//! directory made by an older release gets the DACL too (and its files,
//! which inherit it).

use std::ffi::OsStr;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use windows_sys::Win32::Foundation::{CloseHandle, LocalFree, HANDLE};
#[cfg(test)]
use windows_sys::Win32::Security::Authorization::{
    ConvertSecurityDescriptorToStringSecurityDescriptorW, GetNamedSecurityInfoW,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW,
    SetNamedSecurityInfoW, SDDL_REVISION_1, SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    GetSecurityDescriptorDacl, GetTokenInformation, TokenUser, ACL, DACL_SECURITY_INFORMATION,
    PROTECTED_DACL_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, TOKEN_QUERY, TOKEN_USER,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

/// The DACL [`restrict`] sets, as SDDL: protected (`P`), one ACE allowing
/// (`A`) full file access (`FA`) to `sid`, inherited by files (`OI`) and
/// directories (`CI`) made inside.
pub fn sddl(sid: &str) -> String {
    format!("D:P(A;OICI;FA;;;{sid})")
}

/// Gives `dir` the DACL of [`sddl`] for the current user.
pub fn restrict(dir: &Path) -> io::Result<()> {
    let sd = descriptor(&sddl(&current_user_sid()?))?;
    let (mut present, mut defaulted) = (0, 0);
    let mut dacl: *mut ACL = ptr::null_mut();
    // SAFETY: `sd.0` is a valid descriptor; `dacl` points into it and is
    // used only while `sd` lives.
    if unsafe { GetSecurityDescriptorDacl(sd.0, &mut present, &mut dacl, &mut defaulted) } == 0 {
        return Err(io::Error::last_os_error());
    }
    if present == 0 || dacl.is_null() {
        return Err(io::Error::other("the SDDL gave no DACL"));
    }
    let path = wide(dir.as_os_str());
    // SAFETY: `path` is NUL-terminated UTF-16, `dacl` valid (above); no
    // owner, group or SACL is set.
    let status = unsafe {
        SetNamedSecurityInfoW(
            path.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
            ptr::null_mut(),
            ptr::null_mut(),
            dacl,
            ptr::null(),
        )
    };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status as i32));
    }
    Ok(())
}

/// The security descriptor `sddl` describes.
fn descriptor(sddl: &str) -> io::Result<Local> {
    let sddl = wide(OsStr::new(sddl));
    let mut sd: PSECURITY_DESCRIPTOR = ptr::null_mut();
    // SAFETY: `sddl` is NUL-terminated UTF-16; on success `sd` is a
    // LocalAlloc'ed descriptor that `Local` frees.
    let ok = unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Local(sd))
}

/// The current user's SID as a string (`S-1-5-21-…`), from the process's
/// token.
pub fn current_user_sid() -> io::Result<String> {
    let mut token: HANDLE = ptr::null_mut();
    // SAFETY: the pseudo-handle of the current process; `token` receives a
    // handle that `Handle` closes.
    if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let token = Handle(token);
    let mut len = 0u32;
    // SAFETY: asks for the size only (no buffer); fails with
    // ERROR_INSUFFICIENT_BUFFER, setting `len`.
    unsafe { GetTokenInformation(token.0, TokenUser, ptr::null_mut(), 0, &mut len) };
    if len == 0 {
        return Err(io::Error::last_os_error());
    }
    // u64s, so that the TOKEN_USER at its start is aligned.
    let mut buf = vec![0u64; (len as usize).div_ceil(8)];
    // SAFETY: `buf` holds `len` bytes or more.
    let ok =
        unsafe { GetTokenInformation(token.0, TokenUser, buf.as_mut_ptr().cast(), len, &mut len) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: GetTokenInformation(TokenUser) wrote a TOKEN_USER at the
    // start of `buf`, whose SID points into `buf`, alive for this scope.
    let sid = unsafe { (*buf.as_ptr().cast::<TOKEN_USER>()).User.Sid };
    let mut text: *mut u16 = ptr::null_mut();
    // SAFETY: `sid` is valid (above); on success `text` is a LocalAlloc'ed
    // NUL-terminated string that `Local` frees.
    if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let text = Local(text.cast());
    Ok(text.string())
}

/// The DACL of `path`, as SDDL (for the tests: what [`restrict`] set, and
/// what a file made in the directory inherited).
#[cfg(test)]
pub fn dacl_sddl(path: &Path) -> io::Result<String> {
    let path = wide(path.as_os_str());
    let mut sd: PSECURITY_DESCRIPTOR = ptr::null_mut();
    // SAFETY: `path` is NUL-terminated UTF-16; only the descriptor is
    // asked for, a LocalAlloc'ed block that `Local` frees.
    let status = unsafe {
        GetNamedSecurityInfoW(
            path.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            &mut sd,
        )
    };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status as i32));
    }
    dacl_of(&Local(sd))
}

/// The DACL of the descriptor `sd`, as SDDL.
#[cfg(test)]
fn dacl_of(sd: &Local) -> io::Result<String> {
    let mut text: *mut u16 = ptr::null_mut();
    // SAFETY: `sd.0` is a valid descriptor; on success `text` is a
    // LocalAlloc'ed NUL-terminated string that `Local` frees.
    let ok = unsafe {
        ConvertSecurityDescriptorToStringSecurityDescriptorW(
            sd.0,
            SDDL_REVISION_1,
            DACL_SECURITY_INFORMATION,
            &mut text,
            ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Local(text.cast()).string())
}

/// Whether this runs under Wine, which keeps no file's DACL: setting one
/// succeeds and changes nothing (Wine 8), so it cannot be read back.
#[cfg(test)]
fn under_wine() -> bool {
    use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleW, GetProcAddress};
    let ntdll = wide(OsStr::new("ntdll.dll"));
    // SAFETY: ntdll is loaded in every process; the names are
    // NUL-terminated.
    unsafe {
        let module = GetModuleHandleW(ntdll.as_ptr());
        !module.is_null() && GetProcAddress(module, c"wine_get_version".as_ptr().cast()).is_some()
    }
}

fn wide(s: &OsStr) -> Vec<u16> {
    s.encode_wide().chain(Some(0)).collect()
}

/// A LocalAlloc'ed block, freed on drop.
struct Local(*mut core::ffi::c_void);

impl Local {
    /// The block as the NUL-terminated UTF-16 string it holds.
    fn string(&self) -> String {
        // SAFETY: only called on blocks an API filled with a NUL-terminated
        // UTF-16 string.
        let units = unsafe {
            let p = self.0.cast::<u16>();
            let n = (0..).take_while(|&i| *p.add(i) != 0).count();
            std::slice::from_raw_parts(p, n)
        };
        String::from_utf16_lossy(units)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // SAFETY: allocated by the API that returned it, freed once.
        unsafe { LocalFree(self.0) };
    }
}

/// A handle, closed on drop.
struct Handle(HANDLE);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle this module opened, closed once.
        unsafe { CloseHandle(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The ACEs of an SDDL DACL (`D:<flags>(ace)(ace)…`).
    fn aces(sddl: &str) -> Vec<&str> {
        sddl.split('(')
            .skip(1)
            .map(|a| a.trim_end_matches(')'))
            .collect()
    }

    #[test]
    fn the_dacl_set_is_one_inheritable_ace_for_the_current_user_and_nothing_inherited() {
        let sid = current_user_sid().expect("the current user's SID");
        assert!(sid.starts_with("S-1-5-"), "{sid}");
        let sd = descriptor(&sddl(&sid)).expect("a descriptor");
        assert_eq!(
            dacl_of(&sd).expect("its DACL"),
            format!("D:P(A;OICI;FA;;;{sid})")
        );
    }

    /// A prepared directory, and what is made in it, have the current
    /// user's ACE alone; one made before (by an older release, with the
    /// parent's ACEs) gets it too, and so do its files. Read back where
    /// the platform keeps a file's DACL (Windows, not Wine).
    #[test]
    fn a_prepared_directory_and_what_is_made_in_it_are_the_current_users_alone() {
        let base = std::env::temp_dir().join(format!("mcp-retry-acl-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let fresh = base.join("fresh");
        let old = base.join("old");
        fs::create_dir_all(&old).expect("made");
        fs::write(old.join("key"), b"k").expect("written");
        crate::private_files::prepare_dir(&fresh).expect("prepared");
        crate::private_files::prepare_dir(&old).expect("prepared");
        fs::write(fresh.join("entry.json"), b"{}").expect("written");
        let sid = current_user_sid().expect("the current user's SID");
        if under_wine() {
            eprintln!("under Wine, which keeps no file's DACL: not read back");
            let _ = fs::remove_dir_all(&base);
            return;
        }
        for dir in [&fresh, &old] {
            assert_eq!(
                dacl_sddl(dir).expect("its DACL"),
                sddl(&sid),
                "{}",
                dir.display()
            );
        }
        for file in [fresh.join("entry.json"), old.join("key")] {
            let got = dacl_sddl(&file).expect("the file's DACL");
            let list = aces(&got);
            assert_eq!(list.len(), 1, "one ACE on {}: {got}", file.display());
            assert!(list[0].starts_with("A;"), "an allow ACE: {got}");
            assert!(list[0].ends_with(&format!(";;;{sid}")), "for us: {got}");
        }
        let _ = fs::remove_dir_all(&base);
    }
}
