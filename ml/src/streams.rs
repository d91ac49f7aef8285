//! The streaming shuffles CorgiPile is compared with: a sliding window (TensorFlow's shuffle
//! buffer) and a reservoir (multiplexed reservoir sampling).

use crate::arena::TupleArena;
use crate::row::Row;
use crate::shuffle::{bounded, epoch_rng, shuffle_in_place};
use rand_chacha::ChaCha8Rng;

/// One buffered row of a streaming strategy: its buffers are reused, so a full window or
/// reservoir stops allocating. Dense rows keep `indices` empty.
#[derive(Clone, Debug, Default)]
struct Slot {
    label: f64,
    sparse: bool,
    indices: Vec<u32>,
    values: Vec<f64>,
}

impl Slot {
    fn set(&mut self, label: f64, row: Row) {
        self.label = label;
        self.indices.clear();
        self.values.clear();
        match row {
            Row::Dense(x) => {
                self.sparse = false;
                self.values.extend_from_slice(x);
            }
            Row::Sparse { indices, values } => {
                self.sparse = true;
                self.indices.extend_from_slice(indices);
                self.values.extend_from_slice(values);
            }
        }
    }

    fn emit(&self, out: &mut TupleArena) {
        if self.sparse {
            out.push_sparse(self.label, &self.indices, &self.values);
        } else {
            out.push(self.label, &self.values);
        }
    }
}

/// TensorFlow's shuffle buffer (the paper's Sliding-Window Shuffle): keep a window of
/// `capacity` rows; each new row evicts a uniformly chosen row of the window, which goes to
/// SGD; at the end of the scan the window is emptied in random order.
#[derive(Debug)]
pub struct SlidingWindow {
    slots: Vec<Slot>,
    capacity: usize,
    rng: ChaCha8Rng,
}

impl SlidingWindow {
    pub fn new(capacity: usize, seed: u64, epoch: u32) -> Self {
        assert!(capacity >= 1);
        SlidingWindow {
            slots: Vec::with_capacity(capacity.min(1 << 20)),
            capacity,
            rng: epoch_rng(seed, 2 * u64::from(epoch) + 1),
        }
    }

    /// Offer one row; the row it evicts (if the window is full) is appended to `out`.
    pub fn push(&mut self, label: f64, row: Row, out: &mut TupleArena) {
        if self.slots.len() < self.capacity {
            let mut slot = Slot::default();
            slot.set(label, row);
            self.slots.push(slot);
            return;
        }
        let j = bounded(&mut self.rng, self.capacity as u64) as usize;
        self.slots[j].emit(out);
        self.slots[j].set(label, row);
    }

    /// End of the scan: every remaining row to `out`, in random order.
    pub fn drain(&mut self, out: &mut TupleArena) {
        shuffle_in_place(&mut self.rng, &mut self.slots);
        for slot in self.slots.drain(..) {
            slot.emit(out);
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Bismarck's multiplexed reservoir sampling (MRS). The scan feeds a reservoir of `capacity`
/// rows by reservoir sampling (Algorithm R); a row that is not kept — the incoming row or the
/// one it replaces — goes straight to SGD (Bismarck's I/O thread); `pass` hands out the whole
/// reservoir in random order (Bismarck's memory thread, which loops over the reservoir).
#[derive(Debug)]
pub struct Reservoir {
    slots: Vec<Slot>,
    capacity: usize,
    seen: u64,
    rng: ChaCha8Rng,
}

impl Reservoir {
    pub fn new(capacity: usize, seed: u64, epoch: u32) -> Self {
        assert!(capacity >= 1);
        Reservoir {
            slots: Vec::with_capacity(capacity.min(1 << 20)),
            capacity,
            seen: 0,
            rng: epoch_rng(seed, 2 * u64::from(epoch) + 1),
        }
    }

    /// Offer one row; the row dropped from the sample (if any) is appended to `dropped`.
    pub fn push(&mut self, label: f64, row: Row, dropped: &mut TupleArena) {
        self.seen += 1;
        if self.slots.len() < self.capacity {
            let mut slot = Slot::default();
            slot.set(label, row);
            self.slots.push(slot);
            return;
        }
        let j = bounded(&mut self.rng, self.seen) as usize;
        if j < self.capacity {
            self.slots[j].emit(dropped);
            self.slots[j].set(label, row);
        } else {
            match row {
                Row::Dense(x) => dropped.push(label, x),
                Row::Sparse { indices, values } => dropped.push_sparse(label, indices, values),
            }
        }
    }

    /// One pass over the reservoir, in a fresh random order, appended to `out`.
    pub fn pass(&mut self, out: &mut TupleArena) {
        shuffle_in_place(&mut self.rng, &mut self.slots);
        for slot in &self.slots {
            slot.emit(out);
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod streaming_tests {
    use super::*;

    fn stream(n: usize) -> TupleArena {
        let mut a = TupleArena::new(1, n);
        for i in 0..n {
            a.push(i as f64, &[i as f64]);
        }
        a
    }

    #[test]
    fn sliding_window_emits_every_row_once_and_mixes_locally() {
        let input = stream(1000);
        let mut w = SlidingWindow::new(50, 1, 1);
        let mut out = TupleArena::new(1, 1000);
        for i in 0..input.len() {
            w.push(input.label(i), input.row(i), &mut out);
        }
        assert_eq!(out.len(), 950);
        w.drain(&mut out);
        let mut seen: Vec<usize> = (0..out.len()).map(|i| out.label(i) as usize).collect();
        let displaced = seen.iter().enumerate().filter(|(p, &v)| *p != v).count();
        assert!(
            displaced > 900,
            "a window of 50 should move almost every row"
        );
        // A row can only come out after it went in: position >= original - window is not
        // guaranteed, but no row may leave before it arrived.
        assert!(seen.iter().enumerate().all(|(p, &v)| p + 50 >= v));
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn reservoir_drops_all_but_capacity_and_samples_uniformly() {
        let input = stream(1000);
        let mut kept_late = 0;
        for seed in 0..200 {
            let mut r = Reservoir::new(100, seed, 1);
            let mut dropped = TupleArena::new(1, 1000);
            for i in 0..input.len() {
                r.push(input.label(i), input.row(i), &mut dropped);
            }
            assert_eq!(dropped.len(), 900);
            assert_eq!(r.len(), 100);
            let mut pass = TupleArena::new(1, 100);
            r.pass(&mut pass);
            let mut all: Vec<usize> = (0..dropped.len())
                .map(|i| dropped.label(i) as usize)
                .chain((0..pass.len()).map(|i| pass.label(i) as usize))
                .collect();
            kept_late += (0..pass.len()).filter(|&i| pass.label(i) >= 500.0).count();
            all.sort_unstable();
            assert_eq!(all, (0..1000).collect::<Vec<_>>());
        }
        // Uniform sample: about half of the kept rows come from the second half of the stream.
        let share = kept_late as f64 / (200.0 * 100.0);
        assert!(
            (share - 0.5).abs() < 0.03,
            "share from the second half: {share}"
        );
    }

    #[test]
    fn streaming_strategies_are_seeded() {
        let input = stream(300);
        let run = |seed| {
            let mut w = SlidingWindow::new(30, seed, 2);
            let mut out = TupleArena::new(1, 300);
            for i in 0..input.len() {
                w.push(input.label(i), input.row(i), &mut out);
            }
            w.drain(&mut out);
            (0..out.len()).map(|i| out.label(i)).collect::<Vec<_>>()
        };
        assert_eq!(run(4), run(4));
        assert_ne!(run(4), run(5));
    }
}
