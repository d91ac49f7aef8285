//! Reads in flight ahead of the block reader, one hint per page range (not per page: measured
//! slower). Before PostgreSQL 17 nothing reads ahead of our random block order: the kernel's
//! read-ahead follows sequential reads only, so a cold epoch waited for every page of every
//! block. The ranges about to be read are hinted to the kernel with
//! `posix_fadvise(WILLNEED)` on the table's segment files, and the kernel reads them in the
//! background. From 17 on the page reader's read stream (and the heap scan's own) keeps reads
//! in flight already: there this is a no-op.
//!
//! The hints are made on a thread of their own: `posix_fadvise` submits the reads before it
//! returns (measured ~0.1 ms per 400 kB range, a quarter of a cold epoch when the backend made
//! them), and the backend is what bounds a cold epoch. The thread makes no PostgreSQL call and
//! touches no shared buffer — it advises the kernel about files, by descriptors of its own —
//! so the threading rule holds. The storage manager of 15 hints one page per call, so the
//! segment files are opened read-only by the path PostgreSQL gives the relation
//! (`GetRelationPath`, relative to the data directory, the backend's working directory; the
//! thread shares it). A file that cannot be opened, or a thread that cannot start, only loses
//! the hints.

use pgrx::pg_sys;

/// Hints for one table's main fork.
pub struct RangePrefetch {
    #[cfg(not(pg_since = "17"))]
    path: Option<String>,
    /// The hint thread's queue of page ranges (started on the first hint).
    #[cfg(not(pg_since = "17"))]
    hints: Option<crossbeam_channel::Sender<(u32, u32)>>,
    /// The hint thread, joined when it is replaced and when the scan's state is dropped.
    #[cfg(not(pg_since = "17"))]
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(not(pg_since = "17"))]
impl Drop for RangePrefetch {
    /// Ends the hint thread and waits for it: the scan's state is dropped when the executor
    /// ends, or when an ERROR aborts the query — then before the session runs its next
    /// statement, so no thread of a failed training outlives it (tests/test_cancel.py).
    fn drop(&mut self) {
        self.hints = None; // the thread's recv sees the channel closed
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl RangePrefetch {
    /// Hints for `rel`'s main fork.
    ///
    /// # Safety
    /// `rel` is an open relation; backend thread.
    #[allow(unused_variables)]
    pub unsafe fn new(rel: pg_sys::Relation) -> RangePrefetch {
        #[cfg(not(pg_since = "17"))]
        {
            // SAFETY: rd_node/rd_locator and rd_backend are set for an open relation;
            // GetRelationPath returns a palloc'd C string, copied and freed here.
            #[cfg(not(pg_since = "16"))]
            let path = {
                let node = (*rel).rd_node;
                pg_sys::GetRelationPath(
                    node.dbNode,
                    node.spcNode,
                    node.relNode,
                    (*rel).rd_backend,
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                )
            };
            #[cfg(pg_since = "16")]
            let path = {
                let node = (*rel).rd_locator;
                pg_sys::GetRelationPath(
                    node.dbOid,
                    node.spcOid,
                    node.relNumber,
                    (*rel).rd_backend,
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                )
            };
            let owned = (!path.is_null()).then(|| {
                std::ffi::CStr::from_ptr(path)
                    .to_string_lossy()
                    .into_owned()
            });
            if !path.is_null() {
                pg_sys::pfree(path.cast());
            }
            RangePrefetch {
                path: owned,
                hints: None,
                thread: None,
            }
        }
        #[cfg(pg_since = "17")]
        RangePrefetch {}
    }

    /// Asks the kernel to read pages `start..start + len` in the background.
    #[allow(unused_variables)]
    pub fn hint(&mut self, start: u32, len: u32) {
        #[cfg(not(pg_since = "17"))]
        {
            if let Some(hints) = &self.hints {
                if hints.send((start, len)).is_ok() {
                    return;
                }
            }
            // First hint, or the thread ended (idle for a while): start one.
            let Some(path) = self.path.clone() else {
                return;
            };
            if let Some(ended) = self.thread.take() {
                let _ = ended.join();
            }
            let (tx, rx) = crossbeam_channel::unbounded();
            let started =
                crate::pg::thread::spawn_with_signals_blocked("corgipile-prefetch", move || {
                    hint_thread(path, rx)
                });
            match started {
                Ok(thread) if tx.send((start, len)).is_ok() => {
                    self.hints = Some(tx);
                    self.thread = Some(thread);
                }
                _ => self.path = None, // no thread: no hints
            }
        }
    }
}

/// Pages per `posix_fadvise` call (128 kB). Linux reads at most the device's read-ahead or
/// largest request size of one WILLNEED hint (`force_page_cache_ra`; 128 kB read-ahead is the
/// common default) and silently drops the rest: a 16 MB range hinted in one call was mostly
/// never read ahead.
#[cfg(not(pg_since = "17"))]
const HINT_PAGES: u64 = 16;

/// The hint thread: advises the kernel of each range it receives; ends when the sender is
/// dropped (the scan's state dropped: the executor ended, normally or by an ERROR) or after a
/// second without a hint (the next hint starts a new thread).
#[cfg(not(pg_since = "17"))]
fn hint_thread(path: String, ranges: crossbeam_channel::Receiver<(u32, u32)>) {
    use std::os::unix::io::AsRawFd;
    // Segment files by number: not tried yet (None), or opened (or not: no hints for it).
    let mut segments: Vec<Option<Option<std::fs::File>>> = Vec::new();
    let segment_pages = pg_sys::RELSEG_SIZE as u64;
    let block = pg_sys::BLCKSZ as i64;
    while let Ok((start, len)) = ranges.recv_timeout(std::time::Duration::from_secs(1)) {
        let (mut page, end) = (start as u64, start as u64 + len as u64);
        while page < end {
            let n = (page / segment_pages) as usize;
            let in_segment = page % segment_pages;
            let pages = (end - page).min(segment_pages - in_segment);
            if segments.len() <= n {
                segments.resize_with(n + 1, || None);
            }
            let file = segments[n].get_or_insert_with(|| {
                let name = if n == 0 {
                    path.clone()
                } else {
                    format!("{path}.{n}")
                };
                std::fs::File::open(name).ok()
            });
            if let Some(file) = file {
                let mut at = in_segment;
                while at < in_segment + pages {
                    let chunk = (in_segment + pages - at).min(HINT_PAGES);
                    // SAFETY: a descriptor this thread owns and keeps open; the call only
                    // advises.
                    unsafe {
                        libc::posix_fadvise(
                            file.as_raw_fd(),
                            at as i64 * block,
                            chunk as i64 * block,
                            libc::POSIX_FADV_WILLNEED,
                        );
                    }
                    at += chunk;
                }
            }
            page += pages;
        }
    }
}
