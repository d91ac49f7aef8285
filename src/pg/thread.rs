//! Threads beside the backend's: they never touch PostgreSQL (see DESIGN.md's threading rule)
//! and never receive its signals.

use std::thread::JoinHandle;

/// Spawns a thread that cannot receive any signal: PostgreSQL's signal handlers must run on
/// the backend thread only. The mask is inherited at creation, so block, spawn, restore.
pub fn spawn_with_signals_blocked<T: Send + 'static>(
    name: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    // SAFETY: plain libc signal-mask calls on this thread with valid, initialized sigsets.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
        let spawned = std::thread::Builder::new().name(name.into()).spawn(body);
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        spawned
    }
}
