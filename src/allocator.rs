//! The settings of mimalloc, the allocator of the static x86_64 musl binary
//! (chosen in src/main.rs; every other build keeps its C library's malloc
//! and this does nothing there). Knows nothing of the proxy: `configure` is
//! called once, first thing in `main`, before any thread is started.

/// `mi_option_purge_delay` in mimalloc's `mi_option_t`, which the raw
/// bindings name no constant for: 15 in mimalloc 2.x and 3.x alike (the
/// enum keeps retired options as placeholders, so that values never move).
#[cfg(all(target_env = "musl", target_arch = "x86_64"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed pages go back to the system when they are freed. mimalloc's
/// default is a second later, and only once the thread that owns them
/// allocates or frees again, so an idle proxy kept what a burst had used:
/// 61 MB after 400 notifications of 1 MiB, 155 MB after one `tools/call`
/// of 60 MiB, where glibc's build (with `malloc_trim`) and musl's malloc
/// came back to 3–16 MB (see BENCHMARKS.md, *The static binary's
/// allocator*).
pub fn configure() {
    #[cfg(all(target_env = "musl", target_arch = "x86_64"))]
    // SAFETY: mi_option_set takes any option and value; it is not thread
    // safe, and `main` calls this before starting a thread.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}
