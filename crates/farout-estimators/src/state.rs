//! Per-sample variational state of the A&R estimators ([`SampleState`]): a row of `width` f32
//! values per training sample, read when the sample's step starts, written back when it ends and
//! saved in checkpoints. This is the O(N) memory the A&R paper notes (Section 4, footnote 4).
//!
//! ```text
//! ar_softmax               [log eta, t]       eta = 1 at first;  local step a = (1 + t)^-0.9
//! ar_probit, ar_logistic   [mu, gamma, t]     q(eps) = mu + softplus(gamma) u;  mu = 0 and
//!                                             softplus(gamma) = 1 at first;  a = 0.01 (1 + t)^-0.9
//! ```
//!
//! `t` counts the sample's visits, so each sample's local steps follow their own Robbins–Monro
//! sequence (`ar.rs` has the steps). Skip-gram keeps one row per context word, since its
//! features depend on the context word alone.

use std::sync::atomic::{AtomicU32, Ordering};

/// Per-sample variational parameters (A&R's eta, or mu and gamma), `width` f32 values per
/// training sample, shared by the threads of a batch.
///
/// A sample appears at most once in a batch, so each row has one writer per step; relaxed
/// atomics make that sharing safe without locks or `unsafe`.
#[derive(Debug)]
pub struct SampleState {
    width: usize,
    values: Vec<AtomicU32>,
}

impl SampleState {
    /// `n` rows, each initialised to `init` (its length is the width).
    pub fn new(n: usize, init: &[f32]) -> Self {
        let values = (0..n).flat_map(|_| init.iter().map(|v| AtomicU32::new(v.to_bits()))).collect();
        Self { width: init.len(), values }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.values.len().checked_div(self.width).unwrap_or(0)
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Values per sample.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Reads sample `i` into `out` (length `width`).
    pub fn read(&self, i: usize, out: &mut [f32]) {
        let row = &self.values[i * self.width..(i + 1) * self.width];
        for (o, v) in out.iter_mut().zip(row) {
            *o = f32::from_bits(v.load(Ordering::Relaxed));
        }
    }

    /// Writes sample `i` from `vals` (length `width`).
    pub fn write(&self, i: usize, vals: &[f32]) {
        let row = &self.values[i * self.width..(i + 1) * self.width];
        for (v, x) in row.iter().zip(vals) {
            v.store(x.to_bits(), Ordering::Relaxed);
        }
    }

    /// All values, row-major (for checkpoints).
    pub fn to_vec(&self) -> Vec<f32> {
        self.values.iter().map(|v| f32::from_bits(v.load(Ordering::Relaxed))).collect()
    }

    /// Restores values saved by [`Self::to_vec`]; `false` (and nothing changed) when the length
    /// does not match.
    pub fn restore(&self, vals: &[f32]) -> bool {
        if vals.len() != self.values.len() {
            return false;
        }
        for (v, x) in self.values.iter().zip(vals) {
            v.store(x.to_bits(), Ordering::Relaxed);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_and_restore_checks_length() {
        let s = SampleState::new(3, &[1.0, 0.0]);
        assert_eq!((s.len(), s.width()), (3, 2));
        s.write(1, &[2.5, -1.0]);
        let mut r = [0.0; 2];
        s.read(1, &mut r);
        assert_eq!(r, [2.5, -1.0]);
        let saved = s.to_vec();
        assert_eq!(saved, vec![1.0, 0.0, 2.5, -1.0, 1.0, 0.0]);
        let t = SampleState::new(3, &[0.0, 0.0]);
        assert!(t.restore(&saved) && t.to_vec() == saved);
        assert!(!t.restore(&saved[..4]));
    }
}
