//! The storage of [`SphericalIndex`]: every cluster's members and a contiguous copy of their
//! rows (with int8 scoring also the rows' codes), which the search scans instead of gathering
//! rows scattered over `W`.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::{Scoring, SphericalIndex};
use crate::quant::QuantRows;
use farout_core::ClassId;

/// The members of one cluster and a copy of their rows (`ids.len() x D`, row-major, in the same
/// order) as of their last build, sync or refresh; with int8 scoring also the rows' codes.
#[derive(Clone, Debug)]
pub(super) struct Cluster {
    pub(super) ids: Vec<ClassId>,
    pub(super) rows: Vec<f32>,
    pub(super) codes: Option<QuantRows>,
}

impl Cluster {
    pub(super) fn new(scoring: Scoring, d: usize, capacity: usize) -> Self {
        Self {
            ids: Vec::with_capacity(capacity),
            rows: Vec::with_capacity(capacity * d),
            codes: (scoring == Scoring::Int8).then(|| QuantRows::new(d)),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The copy of member `at`.
    pub(super) fn row(&self, at: usize, d: usize) -> &[f32] {
        &self.rows[at * d..(at + 1) * d]
    }

    /// Overwrites the copy of member `at`.
    pub(super) fn set(&mut self, at: usize, row: &[f32]) {
        self.rows[at * row.len()..(at + 1) * row.len()].copy_from_slice(row);
        if let Some(codes) = &mut self.codes {
            codes.set(at, row);
        }
    }

    /// Asks for the memory [`Cluster::set`] will write for member `at`: its copy and, with
    /// int8 scoring, the lines holding its codes.
    pub(super) fn prefetch(&self, at: usize, d: usize) {
        farout_core::kernels::prefetch(self.row(at, d));
        if let Some(codes) = &self.codes {
            codes.prefetch(at);
        }
    }

    pub(super) fn push(&mut self, id: ClassId, row: &[f32]) {
        self.ids.push(id);
        self.rows.extend_from_slice(row);
        if let Some(codes) = &mut self.codes {
            codes.push(row);
        }
    }

    /// Removes member `at` by moving the last one into its place; returns the moved id.
    pub(super) fn swap_remove(&mut self, at: usize, d: usize) -> Option<ClassId> {
        let last = self.ids.len() - 1;
        self.ids.swap_remove(at);
        if at != last {
            self.rows.copy_within(last * d..(last + 1) * d, at * d);
        }
        self.rows.truncate(last * d);
        if let Some(codes) = &mut self.codes {
            codes.swap_remove(at);
        }
        self.ids.get(at).copied()
    }

    pub(super) fn bytes(&self) -> usize {
        4 * (self.ids.capacity() + self.rows.capacity()) + self.codes.as_ref().map_or(0, QuantRows::bytes)
    }
}

impl SphericalIndex {
    /// The cluster copy of row `i` (equal to `W`'s row as of its last sync).
    pub(super) fn copy_of(&self, i: ClassId, d: usize) -> &[f32] {
        self.clusters[self.assign[i as usize] as usize].row(self.pos[i as usize] as usize, d)
    }
}
