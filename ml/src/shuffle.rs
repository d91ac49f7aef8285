//! CorgiPile shuffling: a block-level shuffle (which page ranges to read, in
//! what order) plus a tuple-level shuffle of each in-memory buffer.
//!
//! Both use ChaCha8 seeded with the user's seed; each epoch gets its own
//! streams (2·epoch for blocks, 2·epoch+1 for tuples), so a run is
//! reproducible and epochs differ, with no state carried between epochs.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::hash::GOLDEN_GAMMA;

/// A seed for a run that was given none, from the operating system's random source (so that
/// two sessions starting in the same nanosecond still differ); the time if that source fails.
/// At most i64::MAX: it is stored and reported as a bigint-sized JSON integer, so the run can
/// be repeated.
pub fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let seed = match rand_core::OsRng.try_fill_bytes(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            crate::hash::splitmix64(nanos as u64 ^ (nanos >> 64) as u64)
        }
    };
    seed & (i64::MAX as u64)
}

/// Split `n_pages` pages into consecutive blocks of `block_pages` pages (the
/// last may be shorter). Returns `(start_page, n_pages)` pairs.
pub fn split_blocks(n_pages: u32, block_pages: u32) -> Vec<(u32, u32)> {
    assert!(block_pages >= 1, "block_pages must be >= 1");
    let mut blocks = Vec::with_capacity(n_pages.div_ceil(block_pages) as usize);
    let mut start = 0u32;
    while start < n_pages {
        let len = block_pages.min(n_pages - start);
        blocks.push((start, len));
        start += len;
    }
    blocks
}

pub(crate) fn epoch_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Uniform integer in `0..bound` (bound >= 1), unbiased: Lemire's
/// multiply-shift with rejection of the few biased low products.
#[inline]
pub(crate) fn bounded(rng: &mut ChaCha8Rng, bound: u64) -> u64 {
    debug_assert!(bound >= 1);
    if bound <= u64::from(u32::MAX) {
        // 32-bit variant: one next_u32 per draw in the common case.
        let bound = bound as u32;
        let mut m = u64::from(rng.next_u32()) * u64::from(bound);
        if (m as u32) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (m as u32) < threshold {
                m = u64::from(rng.next_u32()) * u64::from(bound);
            }
        }
        m >> 32
    } else {
        let mut m = u128::from(rng.next_u64()) * u128::from(bound);
        if (m as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (m as u64) < threshold {
                m = u128::from(rng.next_u64()) * u128::from(bound);
            }
        }
        (m >> 64) as u64
    }
}

/// Fisher–Yates over the whole slice. The random positions are drawn a batch ahead and their
/// cache lines prefetched before the swaps: a buffer's permutation is megabytes, and a swap
/// with a random position would otherwise wait on a cache miss every time. The draws and swaps
/// happen in the same order as one at a time, so the permutation is the same.
pub(crate) fn shuffle_in_place<T>(rng: &mut ChaCha8Rng, v: &mut [T]) {
    const AHEAD: usize = 16;
    let mut js = [0usize; AHEAD];
    let mut i = v.len().saturating_sub(1);
    while i >= 1 {
        let batch = AHEAD.min(i);
        for (t, j) in js[..batch].iter_mut().enumerate() {
            *j = bounded(rng, (i - t) as u64 + 1) as usize;
            crate::prefetch::prefetch(&v[*j]);
        }
        for (t, &j) in js[..batch].iter().enumerate() {
            v.swap(i - t, j);
        }
        i -= batch;
    }
}

/// Visiting order of `n_blocks` blocks in `epoch` (epochs start at 1).
/// `shuffle == false` → `0..n_blocks` in order; otherwise a uniformly random
/// permutation determined by `(seed, epoch)`.
pub fn block_order(n_blocks: usize, seed: u64, epoch: u32, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n_blocks).collect();
    if shuffle {
        let mut rng = epoch_rng(seed, 2 * u64::from(epoch));
        shuffle_in_place(&mut rng, &mut order);
    }
    order
}

/// Tuple-level shuffler for one epoch. Successive [`permutation`](Self::permutation)
/// calls continue the same RNG stream, so each buffer gets a fresh permutation.
#[derive(Clone, Debug)]
pub struct TupleShuffler {
    rng: ChaCha8Rng,
}

impl TupleShuffler {
    pub fn new(seed: u64, epoch: u32) -> Self {
        TupleShuffler {
            rng: epoch_rng(seed, 2 * u64::from(epoch) + 1),
        }
    }

    /// Fill `out` with a uniformly random permutation of `0..n`, reusing its
    /// allocation. Panics if `n` exceeds `u32::MAX + 1`.
    pub fn permutation(&mut self, n: usize, out: &mut Vec<u32>) {
        assert!(
            n as u64 <= u64::from(u32::MAX) + 1,
            "permutation too large: {n}"
        );
        out.clear();
        out.extend((0..n as u64).map(|i| i as u32));
        shuffle_in_place(&mut self.rng, out);
    }

    /// Deals `n` rows arriving one after another to `buckets` uniformly random buckets: the
    /// k-th row takes the next free position of its bucket (`slots[k]`; the buckets are
    /// consecutive ranges, bucket b = `starts[b]..starts[b+1]`). Visiting the buckets in turn,
    /// each in a uniformly random order of its own, visits the rows in a uniformly random
    /// permutation: it orders them by i.i.d. uniform keys (bucket, then position within it).
    pub fn bucket_slots(
        &mut self,
        n: usize,
        buckets: usize,
        slots: &mut Vec<u32>,
        starts: &mut Vec<u32>,
    ) {
        assert!(n as u64 <= u64::from(u32::MAX), "too many rows: {n}");
        let buckets = buckets.clamp(1, n.max(1));
        slots.clear();
        slots.extend((0..n).map(|_| bounded(&mut self.rng, buckets as u64) as u32));
        // starts[b] = rows in buckets before b; then each label becomes its bucket's next slot.
        starts.clear();
        starts.resize(buckets + 1, 0);
        for &b in slots.iter() {
            starts[b as usize + 1] += 1;
        }
        for b in 1..=buckets {
            starts[b] += starts[b - 1];
        }
        let mut next: Vec<u32> = starts[..buckets].to_vec();
        for slot in slots.iter_mut() {
            let b = *slot as usize;
            *slot = next[b];
            next[b] += 1;
        }
    }

    /// Shuffles each bucket's range of `v` (see [`bucket_slots`](Self::bucket_slots)) in place,
    /// bucket after bucket.
    pub fn shuffle_buckets(&mut self, starts: &[u32], v: &mut [u32]) {
        for range in starts.windows(2) {
            shuffle_in_place(&mut self.rng, &mut v[range[0] as usize..range[1] as usize]);
        }
    }

    /// The order to visit a filled buffer's `len` rows in (indices into the buffer, whose rows
    /// are in the order they arrived), drawn as `plan` says; `out`'s allocation is reused.
    ///
    /// `Bucketed` gives the visiting order of a dense buffer filled scattered into its buckets
    /// and visited bucket after bucket (as 0.4.0 did, for cache-local reads by SGD): the same
    /// draws in the same order, mapped back to arrival order, so that a seed still visits the
    /// rows in the same order. Filling scattered cost the backend, the bottleneck of an epoch,
    /// about a tenth of its time; visiting in this order costs the SGD thread, which has time
    /// to spare, random reads over the buffer, which it prefetches. A buffer that got fewer
    /// rows than planned (a pass's last) was compacted in the order of the rows' positions and
    /// permuted as a whole, as here.
    pub fn visiting_order(&mut self, plan: BufferShuffle, len: usize, out: &mut Vec<u32>) {
        let (rows, buckets) = match plan {
            BufferShuffle::Whole => return self.permutation(len, out),
            BufferShuffle::Bucketed { rows, buckets } => (rows, buckets),
        };
        assert!(len <= rows, "{len} rows in a buffer planned for {rows}");
        let (mut slots, mut starts) = (Vec::new(), Vec::new());
        self.bucket_slots(rows, buckets, &mut slots, &mut starts);
        out.clear();
        if len == rows {
            // by position: the row that went there.
            out.resize(rows, 0);
            for (row, &slot) in slots.iter().enumerate() {
                out[slot as usize] = row as u32;
            }
            self.shuffle_buckets(&starts, out);
        } else {
            out.extend(0..len as u32);
            out.sort_unstable_by_key(|&row| slots[row as usize]);
            shuffle_in_place(&mut self.rng, out);
        }
    }
}

/// How a filled buffer's rows are shuffled (see [`TupleShuffler::visiting_order`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferShuffle {
    /// One uniformly random permutation of the rows.
    Whole,
    /// Rows dealt to `buckets` random buckets (planned for `rows` rows), then each bucket in
    /// random order: also a uniformly random permutation.
    Bucketed { rows: usize, buckets: usize },
}

/// A dense buffer's bucket size for [`BufferShuffle::Bucketed`]: 0.4.0 filled buffers
/// scattered into buckets of this size (measured then on a 92 MB buffer: 256 kB buckets
/// 0.77 s per epoch, 2 MB 0.72 s, 8 MB 0.77 s, one permutation of the whole buffer 0.81 s);
/// kept so that models stay the same.
pub const SHUFFLE_BUCKET_BYTES: usize = 2 << 20;

/// The random draws of a two-pass pile shuffle (Rao's algorithm; `corgipile_shuffle`): pass 1
/// sends every row to a uniformly random pile, pass 2 shuffles each pile (Fisher–Yates) and
/// appends it to the output. The result is a uniform permutation: choosing a pile is sorting
/// on the first digits of a uniform key, shuffling a pile is sorting on the rest. A pile too
/// big for memory is split again into sub-piles by the same rule (`subpiles`), which keeps the
/// permutation uniform (the pile sizes are independent of the order within them).
pub struct PileShuffler {
    seed: u64,
    rng: ChaCha8Rng,
}

impl PileShuffler {
    /// Stream 0 draws the piles of pass 1.
    pub fn new(seed: u64) -> Self {
        PileShuffler {
            seed,
            rng: epoch_rng(seed, 0),
        }
    }

    /// The pile (in `0..piles`) of the next row of pass 1.
    #[inline]
    pub fn pile(&mut self, piles: usize) -> usize {
        bounded(&mut self.rng, piles.max(1) as u64) as usize
    }

    /// A shuffler for the sub-piles of pile `path` (its own stream, so the draws of one pile do
    /// not depend on how many rows another had).
    pub fn subpiles(&self, path: u64) -> PileShuffler {
        PileShuffler {
            seed: self.seed,
            rng: epoch_rng(self.seed ^ GOLDEN_GAMMA, path),
        }
    }

    /// Fisher–Yates of pile `pile`'s rows in memory (pass 2), from the pile's own stream.
    pub fn shuffle_pile<T>(&self, pile: u64, rows: &mut [T]) {
        let mut rng = epoch_rng(self.seed, pile.wrapping_add(1));
        shuffle_in_place(&mut rng, rows);
    }
}

/// The size a pile aims at: small enough that pass 2's reads of its rows in random order hit
/// the CPU caches (a pile of hundreds of MB costs a cache and a TLB miss per row: measured
/// 1.5 s of 6 s on a 925 MB table), large enough that pass 1's appends to the open piles stay
/// few and sequential.
pub const CACHE_PILE_BYTES: u64 = 4 << 20;

/// How many piles pass 1 writes: enough that the expected pile is about CACHE_PILE_BYTES and,
/// with headroom of a few standard deviations, fits `memory` bytes; at least 1, at most
/// `max_piles`.
pub fn pile_count(data_bytes: u64, memory: u64, max_piles: usize) -> usize {
    // At most half of the memory for the expected pile: piles vary in size (and rows in width).
    let per_pile = (memory / 2).clamp(1, CACHE_PILE_BYTES);
    (data_bytes.div_ceil(per_pile) as usize).clamp(1, max_piles.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_permutation(v: &[usize]) -> bool {
        let mut seen = vec![false; v.len()];
        v.iter()
            .all(|&i| i < seen.len() && !std::mem::replace(&mut seen[i], true))
    }

    #[test]
    fn batched_shuffle_is_the_plain_fisher_yates() {
        for n in [0usize, 1, 2, 15, 16, 17, 33, 1000] {
            let mut batched: Vec<usize> = (0..n).collect();
            shuffle_in_place(&mut epoch_rng(9, 3), &mut batched);
            let mut plain: Vec<usize> = (0..n).collect();
            let mut rng = epoch_rng(9, 3);
            for i in (1..n).rev() {
                let j = bounded(&mut rng, i as u64 + 1) as usize;
                plain.swap(i, j);
            }
            assert_eq!(batched, plain, "n = {n}");
        }
    }

    #[test]
    fn split_blocks_cases() {
        assert!(split_blocks(0, 4).is_empty());
        assert_eq!(split_blocks(10, 4), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(split_blocks(8, 4), vec![(0, 4), (4, 4)]);
        assert_eq!(split_blocks(3, 10), vec![(0, 3)]);
        assert_eq!(split_blocks(3, 1), vec![(0, 1), (1, 1), (2, 1)]);
        // No overflow at the top of the page range.
        let b = split_blocks(u32::MAX, 1 << 30);
        assert_eq!(b.len(), 4);
        assert_eq!(b[3], (3 << 30, (1 << 30) - 1));
    }

    #[test]
    #[should_panic]
    fn split_blocks_rejects_zero() {
        split_blocks(10, 0);
    }

    #[test]
    fn block_order_unshuffled_is_identity() {
        assert_eq!(block_order(5, 42, 3, false), vec![0, 1, 2, 3, 4]);
        assert!(block_order(0, 42, 1, true).is_empty());
        assert_eq!(block_order(1, 42, 1, true), vec![0]);
    }

    #[test]
    fn block_order_is_reproducible_permutation_differing_by_epoch_and_seed() {
        let e1 = block_order(100, 7, 1, true);
        let e2 = block_order(100, 7, 2, true);
        assert!(is_permutation(&e1) && is_permutation(&e2));
        assert_eq!(e1, block_order(100, 7, 1, true));
        assert_ne!(e1, e2);
        assert_ne!(e1, block_order(100, 8, 1, true));
        assert_ne!(e1, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn tuple_permutation_is_permutation_and_stream_continues() {
        let mut s = TupleShuffler::new(1, 1);
        let mut out = Vec::new();
        s.permutation(1000, &mut out);
        let first: Vec<usize> = out.iter().map(|&i| i as usize).collect();
        assert!(is_permutation(&first));
        s.permutation(1000, &mut out);
        let second: Vec<usize> = out.iter().map(|&i| i as usize).collect();
        assert!(is_permutation(&second));
        assert_ne!(first, second, "successive calls continue the stream");

        // Same (seed, epoch) → same sequence; tuple stream differs from the block stream.
        let mut again = TupleShuffler::new(1, 1);
        again.permutation(1000, &mut out);
        assert!(out.iter().map(|&i| i as usize).eq(first.iter().copied()));
        assert_ne!(first, block_order(1000, 1, 1, true));

        s.permutation(0, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn tuple_permutation_is_roughly_uniform() {
        // Position of element 0 must be uniform over 0..n; and all n! orders of
        // a small n must appear about equally often.
        let n = 6;
        let draws = 60_000;
        let mut s = TupleShuffler::new(12345, 1);
        let mut out = Vec::new();
        let mut pos_counts = vec![0u64; n];
        for _ in 0..draws {
            s.permutation(n, &mut out);
            pos_counts[out.iter().position(|&v| v == 0).unwrap()] += 1;
        }
        let expected = draws as f64 / n as f64;
        let chi2: f64 = pos_counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // 5 degrees of freedom: P(chi2 > 30) ≈ 1.5e-5.
        assert!(chi2 < 30.0, "chi2 = {chi2}, counts = {pos_counts:?}");

        let mut perm_counts = std::collections::HashMap::new();
        let mut s = TupleShuffler::new(999, 3);
        for _ in 0..60_000 {
            s.permutation(3, &mut out);
            *perm_counts.entry(out.clone()).or_insert(0u64) += 1;
        }
        assert_eq!(perm_counts.len(), 6);
        let chi2: f64 = perm_counts
            .values()
            .map(|&c| (c as f64 - 10_000.0).powi(2) / 10_000.0)
            .sum();
        assert!(chi2 < 30.0, "chi2 = {chi2}, counts = {perm_counts:?}");
    }

    #[test]
    fn bounded_is_in_range_and_unbiased_for_awkward_bound() {
        let mut rng = epoch_rng(5, 0);
        // bound = 3·2^30 makes naive `x % bound` visibly biased; check the halves.
        let bound = 3u64 << 30;
        let mut low = 0u64;
        let n = 200_000;
        for _ in 0..n {
            let v = bounded(&mut rng, bound);
            assert!(v < bound);
            if v < bound / 2 {
                low += 1;
            }
        }
        let frac = low as f64 / n as f64;
        assert!((frac - 0.5).abs() < 0.01, "low half fraction {frac}");
        for _ in 0..1000 {
            assert!(bounded(&mut rng, (1u64 << 40) + 3) < (1u64 << 40) + 3);
            assert_eq!(bounded(&mut rng, 1), 0);
        }
    }

    #[test]
    fn random_seeds_differ_and_fit_a_bigint() {
        let seeds: Vec<u64> = (0..64).map(|_| random_seed()).collect();
        assert!(seeds.iter().all(|&s| s <= i64::MAX as u64));
        let mut distinct = seeds.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), seeds.len());
    }
}
