//! [`ShardedLayer`]: one rank's rows of a class-sharded output layer, with the collectives'
//! time and bytes counted; its steps are the free functions of [`crate::sharded`] (exact
//! softmax) and [`crate::sharded_sparse`] (every other estimator).

use crate::sharded::{merged_top_k, softmax_step};
use crate::{Error, OptimizerConfig, OutputLayer, OutputLayerConfig, StepStats};
use farout_core::topk::Hit;
use farout_core::{ClassId, Matrix, ParamError, Rng};
use farout_dist::{Collective, DistError, Strided};
use farout_estimators::Batch;

/// One rank's rows of a class-sharded output layer.
pub struct ShardedLayer {
    layer: OutputLayer,
    shard: Strided,
    /// Seconds spent in collectives since [`ShardedLayer::take_comm_seconds`].
    comm_seconds: f64,
    /// Bytes sent to collectives since [`ShardedLayer::take_comm_bytes`].
    comm_bytes: usize,
}

impl ShardedLayer {
    /// Rank `rank`'s share of an `n_classes x d_model` layer dealt over `ranks` ranks (every
    /// `ranks`-th class, [`Strided`]), initialised as [`OutputLayer::new`] initialises those rows.
    pub fn new(
        n_classes: usize,
        rank: usize,
        ranks: usize,
        d_model: usize,
        config: &OutputLayerConfig,
        optimizer: &OptimizerConfig,
        seed: u64,
    ) -> Result<Self, Error> {
        if n_classes < ranks {
            return Err(Error::Param(ParamError::message(
                "output",
                format!("{n_classes} classes cannot be split over {ranks} ranks (each needs one)"),
            )));
        }
        let shard = Strided::new(n_classes, rank, ranks)
            .map_err(|e| Error::Param(ParamError::message("output", e.to_string())))?;
        let layer = OutputLayer::with_classes(shard, d_model, config, optimizer, seed)?;
        Ok(Self { layer, shard, comm_seconds: 0.0, comm_bytes: 0 })
    }

    /// The global classes this rank owns: its local row `l` is class `shard().global(l)`.
    pub fn shard(&self) -> &Strided {
        &self.shard
    }

    /// Classes of the whole layer.
    pub fn n_classes(&self) -> usize {
        self.shard.rows()
    }

    /// This rank's rows as a layer of their own.
    pub fn layer(&self) -> &OutputLayer {
        &self.layer
    }

    /// Seconds spent in collectives since the last call (the communication share of steps).
    pub fn take_comm_seconds(&mut self) -> f64 {
        std::mem::take(&mut self.comm_seconds)
    }

    /// Bytes this rank contributed to collectives since the last call (each collective counted
    /// once).
    pub fn take_comm_bytes(&mut self) -> usize {
        std::mem::take(&mut self.comm_bytes)
    }

    /// Bytes one rank sends per softmax step of `batch` samples (each collective counted once):
    /// the max and the two sums per sample, and `dL/dphi` when wanted.
    pub fn softmax_step_bytes(batch: usize, d_model: usize, want_dphi: bool) -> usize {
        4 * batch + 16 * batch + if want_dphi { 4 * batch * d_model } else { 0 }
    }

    /// One exact-softmax step on `phi` (the same batch on every rank) with global class ids in
    /// `positives`: the loss of the whole layer (the same on every rank), `dL/dphi` summed over
    /// the ranks (read it with `layer().dphi()`, when `want_dphi`), and this rank's rows updated;
    /// `class_chunk` as in [`softmax_step`].
    pub fn softmax_step(
        &mut self,
        comm: &dyn Collective,
        phi: &Matrix,
        positives: &[&[ClassId]],
        want_dphi: bool,
        class_chunk: usize,
    ) -> Result<StepStats, DistError> {
        let (stats, seconds) =
            softmax_step(&mut self.layer, &self.shard, comm, phi, positives, want_dphi, class_chunk)?;
        self.comm_seconds += seconds;
        self.comm_bytes += Self::softmax_step_bytes(phi.rows(), self.layer.d_model(), want_dphi);
        Ok(stats)
    }

    /// One step of `estimator` ([`crate::sharded_sparse::estimator_step`]): the loss of the
    /// whole layer's estimate (the same on every rank), `dL/dphi` summed over the ranks (when
    /// `want_dphi`), and this rank's rows updated. `rng` must be in the same state on every
    /// rank; `class_chunk` as in [`softmax_step`].
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        estimator: &dyn farout_estimators::GradientEstimator,
        batch: Batch,
        rng: &mut Rng,
        want_dphi: bool,
        class_chunk: usize,
    ) -> Result<StepStats, DistError> {
        let (stats, cost) = crate::sharded_sparse::estimator_step(
            &mut self.layer,
            &self.shard,
            comm,
            estimator,
            batch,
            rng,
            want_dphi,
            class_chunk,
        )?;
        self.comm_seconds += cost.seconds;
        self.comm_bytes += cost.bytes;
        Ok(stats)
    }

    /// This rank's rows, to attach an index to them.
    pub fn layer_mut(&mut self) -> &mut OutputLayer {
        &mut self.layer
    }

    /// The `k` best classes of every row of `phi` over the whole layer, best first, with global
    /// ids (ties to the lower class, as [`top_k`] breaks them over all scores); on every rank.
    pub fn top_k(&self, comm: &dyn Collective, phi: &Matrix, k: usize) -> Result<Vec<Vec<Hit>>, DistError> {
        let mut z = Matrix::default();
        self.layer.scores(phi, &mut z);
        merged_top_k(comm, &z, &self.shard, k)
    }
}
