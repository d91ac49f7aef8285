//! Reading a random block order from storage at close to sequential speed: the pages about to
//! be read are hinted to storage a window ahead of the reader, in batches, each batch's blocks
//! sorted by page and merged into ranges (one hint per range, not per page: measured slower).
//! The reader still reads them in the epoch's random order, from the page cache. (Reading each
//! buffer's blocks in ascending order instead was tried: where a buffer ends inside such a
//! sorted group, it takes the group's lowest pages and the next buffer its highest, and on a
//! table clustered by label the last iterate of a 3-epoch SVM fell from 0.94 to 0.83.)

use super::leaves::TableScan;
use super::Block;

/// Blocks of a batch this close are hinted as one range, the pages between them too: small
/// blocks (the auto size of a small table is one page) would otherwise be many random 8 kB
/// reads. Every page is read in every epoch, so a page read early is one a later batch finds
/// cached. 32 (as before) read more of what the reader does not yet wait for.
const GAP_PAGES: u32 = 8;

/// How far ahead of the reader pages are hinted at most (16 MB): enough reads in flight to
/// keep the device busy, few enough that they do not crowd out the reads the reader waits for.
const MAX_WINDOW_PAGES: u64 = 2048;

/// How far ahead of the reader the pages of a pass whose buffer holds `buffer_pages` pages are
/// hinted: about one buffer (whole blocks: at least the next one). Further, the kernel reads
/// pages of the next buffer before those of this one the reader waits for. This window with
/// 8-page gaps, against 2048 pages with 32-page gaps, six cold epochs each side by side: a
/// 31 MB table of one-page blocks (380 a buffer) 0.061 → 0.053 s, a 925 MB table the same
/// within the rounds' range (docs/results.md, "Cold reads").
pub(super) fn hint_window(buffer_pages: u64) -> u64 {
    buffer_pages.clamp(1, MAX_WINDOW_PAGES)
}

/// The hints of one pass: blocks `..next` of its order have been hinted, `pages_ahead` pages
/// of them not yet begun by the reader.
pub(super) struct ReadAhead {
    enabled: bool,
    window: u64,
    next: usize,
    pages_ahead: u64,
    /// The batch being hinted: leaf, first page, pages (kept for its allocation).
    batch: Vec<(u32, u32, u32)>,
}

impl ReadAhead {
    /// `enabled`: the pass's order is not the table's (a sequential scan needs no hints: the
    /// kernel reads ahead of it); `window`: see [`hint_window`].
    pub(super) fn new(enabled: bool, window: u64) -> ReadAhead {
        ReadAhead {
            enabled,
            window,
            next: 0,
            pages_ahead: 0,
            batch: Vec::new(),
        }
    }

    /// The reader begins block `order[i]`. When less than half a window of pages past it is
    /// hinted, the hints are topped up to a whole window, in one batch of ranges.
    pub(super) fn advance(
        &mut self,
        i: usize,
        order: &[usize],
        blocks: &[Block],
        leaves: &mut [TableScan],
    ) {
        if !self.enabled {
            return;
        }
        if i < self.next {
            self.pages_ahead = self.pages_ahead.saturating_sub(blocks[order[i]].len as u64);
            if self.pages_ahead >= self.window.div_ceil(2) {
                return;
            }
        }
        self.batch.clear();
        while self.next < order.len() && self.pages_ahead < self.window {
            let block = blocks[order[self.next]];
            self.batch.push((block.leaf, block.start, block.len));
            if self.next > i {
                self.pages_ahead += block.len as u64;
            }
            self.next += 1;
        }
        self.batch.sort_unstable();
        let mut range: Option<(u32, u32, u32)> = None;
        for &(leaf, start, len) in &self.batch {
            match &mut range {
                Some((l, s, n))
                    if *l == leaf && start >= *s + *n && start - (*s + *n) <= GAP_PAGES =>
                {
                    *n = start + len - *s
                }
                _ => {
                    if let Some((l, s, n)) = range {
                        leaves[l as usize].prefetch.hint(s, n);
                    }
                    range = Some((leaf, start, len));
                }
            }
        }
        if let Some((l, s, n)) = range {
            leaves[l as usize].prefetch.hint(s, n);
        }
    }
}
