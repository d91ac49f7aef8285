//! Hints to the operating system about memory the crate allocates.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Asks Linux to back the reserved capacity of `v` with transparent huge pages (2 MB) where it
/// can, when the capacity spans at least two of them. SGD visits a training buffer in random
/// order: with 4 kB pages nearly every row read is also a TLB miss and a page walk; a buffer
/// of a few hundred huge pages fits the TLB. Only a hint: where huge pages are off
/// (`/sys/kernel/mm/transparent_hugepage/enabled` = never) or the call fails, nothing changes.
pub fn advise_huge_pages<T>(v: &Vec<T>) {
    let Some((first, last)) = huge_pages_within(v) else {
        return;
    };
    #[cfg(target_os = "linux")]
    // SAFETY: madvise only changes how the kernel backs [first, last), a page-aligned range
    // within this Vec's allocation; MADV_HUGEPAGE never changes the memory's contents.
    unsafe {
        libc::madvise(
            first as *mut libc::c_void,
            last - first,
            libc::MADV_HUGEPAGE,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (first, last);
}

const HUGE_PAGE: usize = 2 << 20;

/// The whole huge pages inside the reserved capacity of `v`, when there are at least two: the
/// advice applies to whole pages, and the bytes around the allocation are not ours to advise.
pub fn huge_pages_within<T>(v: &Vec<T>) -> Option<(usize, usize)> {
    let start = v.as_ptr() as usize;
    let end = start + v.capacity() * std::mem::size_of::<T>();
    let (first, last) = (
        start.next_multiple_of(HUGE_PAGE),
        end / HUGE_PAGE * HUGE_PAGE,
    );
    (last >= first + 2 * HUGE_PAGE).then_some((first, last))
}

/// Pages of a buffer being faulted in on a thread of their own (see [`Prefault::start`]).
/// Dropping it stops that thread and waits for it, so the memory outlives every call it makes:
/// hold it in the struct that owns the memory, dropped before the memory is.
#[derive(Debug, Default)]
pub struct Prefault {
    worker: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Prefault {
    /// Faults in `pages` (whole huge pages of allocations, from [`huge_pages_within`]) on a
    /// new thread, from
    /// the end of each backwards (the owner fills them from the front). Why: a training
    /// buffer's first touch costs the thread that touches it the kernel's zeroing of each page
    /// and, on a virtual machine that hands freed memory back to its host (free page
    /// reporting), a host fault per page: measured 0.13–0.34 s for two 92 MB buffers on the
    /// backend in a fresh session, against 0.01 s for pages touched before. The backend is
    /// the bound of a training, the other core has room while the first buffer fills. Only a
    /// hint: a kernel without `MADV_POPULATE_WRITE` (before 5.14), or no thread, changes
    /// nothing.
    pub fn start(pages: impl IntoIterator<Item = Option<(usize, usize)>>) -> Prefault {
        let ranges: Vec<(usize, usize)> = pages.into_iter().flatten().collect();
        if ranges.is_empty() || !cfg!(target_os = "linux") {
            return Prefault::default();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("corgipile-prefault".into())
            .spawn(move || populate(&ranges, &stop_seen));
        Prefault {
            worker: spawned.ok().map(|handle| (stop, handle)),
        }
    }
}

/// A copy of the memory is another allocation, faulted in by the copying.
impl Clone for Prefault {
    fn clone(&self) -> Prefault {
        Prefault::default()
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        if let Some((stop, handle)) = self.worker.take() {
            stop.store(true, Ordering::Relaxed);
            // The thread only makes system calls: it cannot panic in a way worth reporting.
            let _ = handle.join();
        }
    }
}

/// Faults in `ranges` one huge page at a time, last page first, until `stop`.
fn populate(ranges: &[(usize, usize)], stop: &AtomicBool) {
    for &(first, last) in ranges {
        let mut page = last;
        while page > first && !stop.load(Ordering::Relaxed) {
            page -= HUGE_PAGE;
            #[cfg(target_os = "linux")]
            // SAFETY: MADV_POPULATE_WRITE never changes what any memory holds: it maps absent
            // anonymous pages zero-filled (what reading them gives) and leaves present pages'
            // bytes alone; on addresses no longer mapped it fails, and the loop ends. The
            // range is normally still the owner's allocation (its drop waits for this thread);
            // should a sparse buffer outgrow its reservation, the old block is freed while
            // this runs, which by the above changes nothing for whoever holds it next.
            let refused = unsafe {
                libc::madvise(
                    page as *mut libc::c_void,
                    HUGE_PAGE,
                    libc::MADV_POPULATE_WRITE,
                )
            } != 0;
            #[cfg(not(target_os = "linux"))]
            let refused = true;
            if refused {
                return; // an older kernel, or no memory now: the owner's faults will do
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The kernel's flags for the mapping that holds `address` (from /proc/self/smaps).
    fn vm_flags(address: usize) -> Option<String> {
        mapping_field(address, "VmFlags:")
    }

    /// Resident kB of the mapping that holds `address`.
    fn resident_kb(address: usize) -> usize {
        let rss = mapping_field(address, "Rss:").expect("the allocation is mapped");
        rss.trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .expect("Rss in kB")
    }

    /// One field of the mapping that holds `address` (from /proc/self/smaps).
    fn mapping_field(address: usize, field: &str) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&address);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(value) = line.strip_prefix(field) {
                    return Some(value.to_string());
                }
            }
        }
        None
    }

    #[test]
    fn a_large_reservation_is_advised_and_keeps_its_contents() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return; // a kernel without transparent huge pages: the advice is refused
        }
        let mut v: Vec<u64> = Vec::with_capacity(1 << 21); // 16 MB
        v.extend(0..1000);
        advise_huge_pages(&v);
        let inside = (v.as_ptr() as usize).next_multiple_of(2 << 20);
        let flags = vm_flags(inside).expect("the allocation is mapped");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "VmFlags:{flags}"
        );
        assert!(v.iter().copied().eq(0..1000));
        // Too small to hold two huge pages: left alone (and no panic).
        advise_huge_pages(&Vec::<u8>::with_capacity(4096));
        advise_huge_pages(&Vec::<u8>::new());
    }

    #[test]
    fn a_prefault_maps_the_pages_and_keeps_the_contents() {
        let mut v: Vec<u64> = Vec::with_capacity(4 << 20); // 32 MB, untouched but the start
        v.extend(0..1000);
        let address = v.as_ptr() as usize;
        let before = resident_kb(address);
        let started = Prefault::start([huge_pages_within(&v)]);
        assert!(started.worker.is_some(), "no thread started");
        // Dropping waits for the thread: it stops early only when told to.
        let (_, handle) = {
            let mut p = started;
            p.worker.take().expect("a worker")
        };
        handle.join().expect("the thread ends");
        // (Needs Linux 5.14 or later, as every supported system has: Debian 12 ships 6.1.)
        let after = resident_kb(address);
        assert!(
            after >= before + 28 * 1024,
            "{before} kB → {after} kB resident"
        );
        assert!(v.iter().copied().eq(0..1000));
        // Nothing to fault in: no thread.
        assert!(Prefault::start([huge_pages_within(&Vec::<u8>::new())])
            .worker
            .is_none());
    }

    #[test]
    fn dropping_a_prefault_stops_it() {
        let v: Vec<u8> = Vec::with_capacity(1 << 30); // 1 GB: far more than it touches at once
        let p = Prefault::start([huge_pages_within(&v)]);
        drop(p); // returns once the thread has stopped: only then may `v` be freed
        let resident = resident_kb(v.as_ptr() as usize);
        assert!(
            resident < 256 * 1024,
            "{resident} kB faulted in after the stop"
        );
    }
}
