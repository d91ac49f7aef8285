//! Training in several processes at once (PostgreSQL parallel workers): every process trains
//! its own share of the blocks with its own `Trainer`, and every `period` tuples it adds what it
//! learned since its last exchange (its delta) to one model in shared memory and continues from
//! that sum. Every tuple's step thus reaches the shared model exactly once, as in sequential SGD
//! over the processes' tuples interleaved, with the other processes' steps arriving up to
//! `period` tuples late (bounded staleness, as in Hogwild!); a label-clustered share cannot pull
//! the model its way for longer than that.
//!
//! The shared model is plain memory laid out here ([`SharedModel`]): a header with a spin lock
//! and the binary label pair, then the weights and the biases. It is touched only through
//! atomics and raw reads/writes under the lock, so any thread of any process may exchange.

use super::labels::LabelsSeen;
use super::{TrainError, Trainer};
use std::sync::atomic::{AtomicU32, Ordering};

/// Tuples between two exchanges, at least (a big model exchanges less often: an exchange
/// reads and writes every weight three times).
pub const MIN_EXCHANGE_PERIOD: u64 = 1024;

#[repr(C)]
struct Header {
    lock: AtomicU32,
    /// Binary kinds: the distinct label values the processes have seen (0, 1 or 2).
    n_seen: u64,
    seen: [f64; 2],
    /// Weights plus biases: the model that follows the header, then the sums of the
    /// processes' averaged iterates (iterate averaging).
    n_values: u64,
    exchanges: u64,
    average_samples: u64,
}

/// Guards a process's use of shared memory that may be unmapped while a thread uses it (a
/// process that exits unmaps it on its backend thread while its SGD thread may be mid-exchange).
/// Exchanges enter the gate; `close` waits for them to leave, and later ones fail.
pub struct Gate(AtomicU32);

const GATE_CLOSED: u32 = 1 << 31;

impl Gate {
    pub const fn new() -> Gate {
        Gate(AtomicU32::new(GATE_CLOSED))
    }

    /// Opens the gate for a new shared model.
    pub fn open(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// Closes the gate and waits until no exchange is inside (an exchange takes microseconds,
    /// and never waits on anything while inside but the shared lock, whose holder is inside a
    /// gate of its own process and leaves as quickly). Must not be called from inside.
    pub fn close(&self) {
        self.0.fetch_or(GATE_CLOSED, Ordering::AcqRel);
        while self.0.load(Ordering::Acquire) & !GATE_CLOSED != 0 {
            std::hint::spin_loop();
        }
    }

    fn enter(&self) -> bool {
        if self.0.fetch_add(1, Ordering::Acquire) & GATE_CLOSED != 0 {
            self.leave();
            return false;
        }
        true
    }

    fn leave(&self) {
        self.0.fetch_sub(1, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.0.load(Ordering::Relaxed) & GATE_CLOSED != 0
    }
}

impl SharedModel {
    /// A second handle on the same memory (for a closure that also borrows the trainer).
    fn shallow(&self) -> SharedModel {
        SharedModel {
            header: self.header,
            values: self.values,
            n_values: self.n_values,
            gate: self.gate,
        }
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

/// A model in memory shared by the processes of one training.
pub struct SharedModel {
    header: *mut Header,
    values: *mut f64,
    n_values: usize,
    gate: &'static Gate,
}

// SAFETY: the memory outlives every thread that holds a SharedModel (the caller's contract in
// `create`/`attach`), and every access goes through the header's lock.
unsafe impl Send for SharedModel {}

impl SharedModel {
    /// Bytes the shared model of `n_values` weights and biases needs.
    pub fn bytes(n_values: usize) -> usize {
        std::mem::size_of::<Header>() + 2 * n_values * std::mem::size_of::<f64>()
    }

    /// Lays out a zero model at `at`.
    ///
    /// # Safety
    /// `at` is 8-byte aligned, `bytes(n_values)` long, and stays mapped while `gate` is open
    /// (whoever unmaps it closes `gate` first).
    pub unsafe fn create(at: *mut u8, n_values: usize, gate: &'static Gate) -> SharedModel {
        std::ptr::write_bytes(at, 0, Self::bytes(n_values));
        let header = at.cast::<Header>();
        (*header).n_values = n_values as u64;
        SharedModel {
            header,
            values: at.add(std::mem::size_of::<Header>()).cast(),
            n_values,
            gate,
        }
    }

    /// Sets the shared values (the model every process starts from) before any process
    /// exchanges: by the process that created the model, before the others attach.
    pub fn set_values(&mut self, start: &[f64]) {
        assert_eq!(start.len(), self.n_values, "shared model shape");
        // SAFETY: `values` holds n_values f64s (see `create`); no other process has attached
        // yet (the caller's contract), so nothing else reads or writes them.
        unsafe { std::ptr::copy_nonoverlapping(start.as_ptr(), self.values, self.n_values) };
    }

    /// The model another process laid out at `at`; None if it holds another number of values.
    ///
    /// # Safety
    /// As `create`, and `create` was called on `at` before.
    pub unsafe fn attach(at: *mut u8, n_values: usize, gate: &'static Gate) -> Option<SharedModel> {
        let header = at.cast::<Header>();
        ((*header).n_values == n_values as u64).then(|| SharedModel {
            header,
            values: at.add(std::mem::size_of::<Header>()).cast(),
            n_values,
            gate,
        })
    }

    /// Runs `f` inside the gate with the shared lock held. The lock's holder is always inside
    /// its own process's gate and leaves within microseconds (a process unmapping the memory
    /// first waits for that), so spinning is bounded; it gives up when this gate closes.
    fn locked<T>(&self, f: impl FnOnce() -> Result<T, TrainError>) -> Result<T, TrainError> {
        if !self.gate.enter() {
            return Err(TrainError::Interrupted);
        }
        // SAFETY: inside the gate the memory is mapped (see `create`).
        let lock = unsafe { &(*self.header).lock };
        let mut spins = 0u32;
        while lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                if self.gate.is_closed() {
                    self.gate.leave();
                    return Err(TrainError::Interrupted);
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        let result = f();
        lock.store(0, Ordering::Release);
        self.gate.leave();
        result
    }
}

/// A trainer's side of the exchange (a linear [`Trainer`]'s or a network's).
pub(crate) struct Exchange {
    shared: SharedModel,
    /// The shared values this trainer continued from at its last exchange.
    base: Vec<f64>,
    period: u64,
    /// Tuples trained since the last exchange.
    since: u64,
}

impl Exchange {
    /// Exchanges with `shared` every `period` tuples (at least [`MIN_EXCHANGE_PERIOD`]), from
    /// `start`: the values every process starts from, which the shared model holds already
    /// (see [`SharedModel::set_values`]).
    pub(crate) fn new(shared: SharedModel, period: u64, start: &[f64]) -> Exchange {
        assert_eq!(start.len(), shared.n_values, "shared model shape");
        Exchange {
            shared,
            base: start.to_vec(),
            period: period.max(MIN_EXCHANGE_PERIOD),
            since: 0,
        }
    }

    /// Before `tuples` more tuples: true when the period is over (the caller exchanges).
    #[inline(always)]
    pub(crate) fn due(&mut self, tuples: u64) -> bool {
        if self.since >= self.period {
            return true;
        }
        self.since += tuples;
        false
    }

    /// Exchange before the next tuple (the start of an epoch).
    pub(crate) fn at_next_tuple(&mut self) {
        self.since = self.period;
    }

    /// Adds `local`'s steps since the last exchange to the shared values and continues from
    /// the sum. `local` yields the values in the shared model's order.
    pub(crate) fn merge<'a>(
        &mut self,
        local: impl Iterator<Item = &'a mut f64>,
    ) -> Result<(), TrainError> {
        self.since = 0;
        let shared = self.shared.shallow();
        let base = &mut self.base;
        shared.locked(|| {
            // SAFETY: the lock is held; `values` holds n_values f64s (see `create`).
            let values = unsafe { std::slice::from_raw_parts_mut(shared.values, shared.n_values) };
            merge_locked(values, base, local);
            // SAFETY: lock held.
            unsafe { (*shared.header).exchanges += 1 };
            Ok(())
        })
    }
}

/// Under the shared lock: `shared += local - base`, then `local = base = shared`.
fn merge_locked<'a>(
    shared: &mut [f64],
    base: &mut [f64],
    local: impl Iterator<Item = &'a mut f64>,
) {
    for ((l, s), b) in local.zip(shared.iter_mut()).zip(base.iter_mut()) {
        let sum = *s + (*l - *b);
        *s = sum;
        *l = sum;
        *b = sum;
    }
}

impl Trainer {
    /// Makes this trainer exchange with `shared` every `period` tuples (at least
    /// [`MIN_EXCHANGE_PERIOD`]), at the start of every later epoch and at the end of every
    /// epoch. Every process of a training must start from the same model (zeros, or a warm
    /// start's), the one `shared` holds. Iterate averaging: see `contribute_average`.
    pub fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        let start: Vec<f64> = self
            .model
            .weights
            .iter()
            .chain(&self.model.bias)
            .copied()
            .collect();
        self.exchange = Some(Exchange::new(shared, period, &start));
    }

    /// Exchanges now (if exchanging): adds this trainer's steps since its last exchange to the
    /// shared model and continues from the sum.
    pub fn exchange(&mut self) -> Result<(), TrainError> {
        let Some(mut x) = self.exchange.take() else {
            return Ok(());
        };
        x.since = 0;
        let result = self.exchange_with(&mut x);
        self.exchange = Some(x);
        result
    }

    fn exchange_with(&mut self, x: &mut Exchange) -> Result<(), TrainError> {
        let binary = self.config.kind.is_binary();
        self.sync();
        let shared = x.shared.shallow();
        shared.locked(|| self.exchange_locked(x, binary))
    }

    /// The exchange proper, under the shared model's lock.
    fn exchange_locked(&mut self, x: &mut Exchange, binary: bool) -> Result<(), TrainError> {
        // SAFETY: the lock is held; the header lives as long as `x.shared`.
        let header = unsafe { &mut *x.shared.header };
        if binary && !self.agree_on_labels(header)? {
            // The mapping is still provisional (every process has seen one value at most):
            // steps may have the wrong sign, so this one trains on alone for now.
            return Ok(());
        }
        // SAFETY: `values` holds n_values f64s (see `create`), and the lock is held.
        let shared = unsafe { std::slice::from_raw_parts_mut(x.shared.values, x.shared.n_values) };
        let local = self
            .model
            .weights
            .iter_mut()
            .chain(self.model.bias.iter_mut());
        merge_locked(shared, &mut x.base, local);
        self.work += shared.len() as u64;
        header.exchanges += 1;
        Ok(())
    }

    /// Binary kinds: adds the label values this trainer has seen to the shared ones; once
    /// two are known (here or in another process), adopts the final mapping (ascending:
    /// negative, positive), flipping a provisional one that had the wrong sign. False while
    /// fewer than two values are known.
    fn agree_on_labels(&mut self, header: &mut Header) -> Result<bool, TrainError> {
        for v in self.labels_seen() {
            let n = header.n_seen as usize;
            if header.seen[..n].contains(&v) {
                continue;
            }
            if n == 2 {
                let [a, b] = header.seen;
                let (a, b) = if a < b { (a, b) } else { (b, a) };
                return Err(TrainError::TooManyLabels { values: [a, b, v] });
            }
            header.seen[n] = v;
            header.n_seen += 1;
        }
        if header.n_seen < 2 {
            return Ok(false);
        }
        let [a, b] = header.seen;
        let (neg, pos) = if a < b { (a, b) } else { (b, a) };
        match self.labels {
            LabelsSeen::Two { .. } => {} // its values are the shared two (added above)
            LabelsSeen::One { value, y } => {
                let y_final = if value == neg { -1.0 } else { 1.0 };
                if y_final != y {
                    self.flip(y);
                }
                self.labels = LabelsSeen::Two { neg, pos };
            }
            LabelsSeen::None => self.labels = LabelsSeen::Two { neg, pos },
        }
        Ok(true)
    }

    /// Before a tuple: exchange if the period is over.
    #[inline(always)]
    pub(super) fn exchange_due(&mut self) -> Result<(), TrainError> {
        if self.exchange.as_mut().is_some_and(|x| x.due(1)) {
            return self.exchange();
        }
        Ok(())
    }

    /// Iterate averaging: adds this trainer's sums of sampled iterates to the shared ones (once,
    /// after its last epoch).
    pub fn contribute_average(&mut self) -> Result<(), TrainError> {
        let (Some(x), Some(a)) = (self.exchange.as_ref(), self.average.as_ref()) else {
            return Ok(());
        };
        if a.samples == 0 {
            return Ok(());
        }
        let shared = &x.shared;
        shared.locked(|| {
            // SAFETY: the averaging sums follow the model values (see `bytes`); lock held.
            let sums = unsafe {
                std::slice::from_raw_parts_mut(shared.values.add(shared.n_values), shared.n_values)
            };
            for (s, v) in sums.iter_mut().zip(a.weights.iter().chain(&a.bias)) {
                *s += v;
            }
            // SAFETY: lock held.
            unsafe { (*shared.header).average_samples += a.samples };
            Ok(())
        })
    }

    /// Iterate averaging: takes the shared sums (every process's samples, once each has
    /// contributed) as this trainer's, so that `into_model` returns the average of all.
    pub fn adopt_shared_average(&mut self) {
        let (Some(x), Some(a)) = (self.exchange.as_ref(), self.average.as_mut()) else {
            return;
        };
        let n = x.shared.n_values;
        let d = self.model.weights.len();
        // SAFETY: no process writes any more (all contributed before this call), and the
        // caller keeps the memory mapped while it calls.
        let sums = unsafe { std::slice::from_raw_parts(x.shared.values.add(n), n) };
        a.weights.clear();
        a.weights.extend_from_slice(&sums[..d]);
        a.bias.clear();
        a.bias.extend_from_slice(&sums[d..]);
        // SAFETY: as above.
        a.samples = unsafe { (*x.shared.header).average_samples };
    }

    /// At the start of an epoch: exchange before its first tuple.
    pub(super) fn exchange_at_next_tuple(&mut self) {
        if let Some(x) = self.exchange.as_mut() {
            x.at_next_tuple();
        }
    }
}
