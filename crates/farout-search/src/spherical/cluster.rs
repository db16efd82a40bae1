//! The storage of [`SphericalIndex`]: every cluster's members and a contiguous copy of their
//! rows (with int8 scoring also the rows' codes, with `pq4` scoring, once a lone query has
//! asked for them, also their 4-bit codes), which the search scans instead of gathering rows
//! scattered over `W`.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::Scoring;
use crate::ReserveByEighths;
use crate::pq4::{Codebook, Pq4Rows};
use crate::quant::QuantRows;
use farout_core::ClassId;
use std::sync::{Arc, OnceLock};

/// The members of one cluster and a copy of their rows (`ids.len() x D`, row-major, in the same
/// order) as of their last build, sync or refresh; with int8 scoring also the rows' codes, and
/// with `pq4` scoring their 4-bit codes once made (`pq4.rs`: the first lone query that scans
/// them makes every cluster's; from then on they are kept up to date with the copies). The codes
/// sit in huge pages shared by the clusters ([`crate::quant::QuantRows`], [`crate::pq4::Pq4Rows`]).
#[derive(Clone, Debug)]
pub(super) struct Cluster {
    pub(super) ids: Vec<ClassId>,
    pub(super) rows: Vec<f32>,
    pub(super) codes: Option<QuantRows>,
    pub(super) pq4: OnceLock<Pq4Codes>,
}

/// The 4-bit codes of a cluster's rows ([`crate::pq4`]): of their residuals from the cluster's
/// `mean` (fixed when the codes were made), in the codebook shared by all clusters.
#[derive(Clone, Debug)]
pub(super) struct Pq4Codes {
    pub(super) rows: Pq4Rows,
    pub(super) mean: Vec<f32>,
    pub(super) book: Arc<Codebook>,
}

impl Pq4Codes {
    /// Codes of the `rows` (row-major, `mean.len()` wide) against `mean` in `book`.
    pub(super) fn new(rows: &[f32], mean: Vec<f32>, book: Arc<Codebook>) -> Self {
        let mut codes = Self { rows: Pq4Rows::new(book.sub_spaces()), mean, book };
        rows.chunks_exact(codes.mean.len().max(1)).for_each(|row| codes.push(row));
        codes
    }

    fn push(&mut self, row: &[f32]) {
        let (book, mean) = (&self.book, &self.mean);
        self.rows.push_with(|s| book.code_of(s, row, mean));
    }

    fn set(&mut self, at: usize, row: &[f32]) {
        let (book, mean) = (&self.book, &self.mean);
        self.rows.set_with(at, |s| book.code_of(s, row, mean));
    }
}

impl Cluster {
    pub(super) fn new(scoring: Scoring, d: usize, capacity: usize) -> Self {
        Self {
            ids: Vec::with_capacity(capacity),
            rows: Vec::with_capacity(capacity * d),
            codes: scoring.int8_codes().then(|| QuantRows::with_capacity(d, capacity)),
            pq4: OnceLock::new(),
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
        if let Some(pq4) = self.pq4.get_mut() {
            pq4.set(at, row);
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
        self.ids.reserve_by_eighths(1);
        self.rows.reserve_by_eighths(row.len());
        self.ids.push(id);
        self.rows.extend_from_slice(row);
        if let Some(codes) = &mut self.codes {
            codes.push(row);
        }
        if let Some(pq4) = self.pq4.get_mut() {
            pq4.push(row);
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
        if let Some(pq4) = self.pq4.get_mut() {
            pq4.rows.swap_remove(at);
        }
        self.ids.get(at).copied()
    }

    pub(super) fn bytes(&self) -> usize {
        4 * (self.ids.capacity() + self.rows.capacity())
            + self.codes.as_ref().map_or(0, QuantRows::bytes)
            + self.pq4.get().map_or(0, |p| p.rows.bytes() + 4 * p.mean.len())
    }
}
