//! Hints to the operating system about memory the crate allocates.

/// Asks Linux to back the reserved capacity of `v` with transparent huge pages (2 MB) where it
/// can, when the capacity spans at least two of them. SGD visits a training buffer in random
/// order: with 4 kB pages nearly every row read is also a TLB miss and a page walk; a buffer
/// of a few hundred huge pages fits the TLB. Only a hint: where huge pages are off
/// (`/sys/kernel/mm/transparent_hugepage/enabled` = never) or the call fails, nothing changes.
pub fn advise_huge_pages<T>(v: &Vec<T>) {
    const HUGE: usize = 2 << 20;
    let start = v.as_ptr() as usize;
    let end = start + v.capacity() * std::mem::size_of::<T>();
    // Whole huge pages inside the allocation only: the advice applies to whole pages, and the
    // bytes around the allocation are not ours to advise.
    let (first, last) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
    if last < first + 2 * HUGE {
        return;
    }
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
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The kernel's flags for the mapping that holds `address` (from /proc/self/smaps).
    fn vm_flags(address: usize) -> Option<String> {
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
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.to_string());
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
}
