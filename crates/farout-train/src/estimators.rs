//! The gradient estimator a config's `[output]` names, and the index it searches: shared by the
//! classifier trainer and skip-gram.

use crate::Error;
use crate::config::{Config, EstimatorKind, LossKind, OutputConfig, ProposalKind};
use farout_estimators::{
    ArLogistic, ArProbit, ArSoftmax, Exact, GradientEstimator, Ldgs, Loss, Mips, NegativeSampling, Ove, Proposal,
    SampledSoftmax, SmoothedMargin, Softmax,
};
use farout_layer::OutputLayer;

/// An estimator with what goes with it.
pub struct Built {
    /// The configured estimator.
    pub estimator: Box<dyn GradientEstimator>,
    /// The loss it approximates (for exact evaluation).
    pub loss: Box<dyn Loss>,
    /// Classes retrieved per search (`output.top`, or K/100).
    pub search_top: usize,
    /// The sampled-softmax warm-up of `output.warmup_steps`.
    pub warmup: Option<Box<dyn GradientEstimator>>,
}

/// Builds `out.estimator` for `n_classes` classes and `n_data` training samples (the size of
/// A&R's per-sample state). `label_counts` is called only for the unigram proposal.
pub fn build(
    out: &OutputConfig,
    n_classes: usize,
    n_data: usize,
    label_counts: impl FnOnce() -> Vec<u64>,
) -> Result<Built, Error> {
    let percent = (n_classes / 100).max(1); // the paper's K/100 default for Q
    let n_samples =
        if out.n_samples > 0 { out.n_samples } else { ((out.sample_fraction * n_classes as f64) as usize).max(1) };
    let mut label_counts = Some(label_counts);
    let mut proposal = |default: ProposalKind| -> Result<Proposal, Error> {
        Ok(match out.proposal.unwrap_or(default) {
            ProposalKind::Uniform => Proposal::Uniform,
            ProposalKind::LogUniform => Proposal::LogUniform,
            ProposalKind::Unigram => {
                let counts = label_counts.take().expect("one unigram proposal per estimator")();
                Proposal::unigram(&counts, out.alpha).ok_or_else(|| {
                    Error::Mismatch("key `output.proposal` = \"unigram\": the training set has no labels".into())
                })?
            }
        })
    };
    let margin = SmoothedMargin::new(out.mu)?;
    let search_top = if out.top > 0 { out.top } else { percent };
    let (estimator, loss): (Box<dyn GradientEstimator>, Box<dyn Loss>) = match (out.estimator, out.loss) {
        (EstimatorKind::Softmax, _) => (Box::new(Exact::new(Softmax)), Box::new(Softmax)),
        (EstimatorKind::Margin, _) => (Box::new(Exact::new(margin)), Box::new(margin)),
        (EstimatorKind::SampledSoftmax, _) => (
            Box::new(SampledSoftmax::with_proposal(
                n_samples,
                proposal(ProposalKind::Uniform)?,
                out.unique,
                out.shared_samples,
            )?),
            Box::new(Softmax),
        ),
        (EstimatorKind::NegativeSampling, _) => {
            (Box::new(NegativeSampling::new(n_samples, proposal(ProposalKind::Unigram)?)?), Box::new(Softmax))
        }
        (EstimatorKind::Ove, _) => (Box::new(Ove::new(n_samples)?), Box::new(Softmax)),
        (EstimatorKind::ArSoftmax, _) => (Box::new(ArSoftmax::new(n_samples, n_data)?), Box::new(Softmax)),
        (EstimatorKind::ArProbit, _) => (Box::new(ArProbit::new(n_samples, n_data)?), Box::new(Softmax)),
        (EstimatorKind::ArLogistic, _) => (Box::new(ArLogistic::new(n_samples, n_data)?), Box::new(Softmax)),
        (EstimatorKind::Mips, LossKind::Softmax) => (Box::new(Mips::new(Softmax, search_top)?), Box::new(Softmax)),
        (EstimatorKind::Mips, LossKind::Margin) => (Box::new(Mips::new(margin, search_top)?), Box::new(margin)),
        (EstimatorKind::Ldgs, LossKind::Softmax) => (
            Box::new(Ldgs::new(Softmax, search_top, out.iterations, out.active_set, out.tau2, out.rescore)?),
            Box::new(Softmax),
        ),
        (EstimatorKind::Ldgs, LossKind::Margin) => (
            Box::new(Ldgs::new(margin, search_top, out.iterations, out.active_set, out.tau2, out.rescore)?),
            Box::new(margin),
        ),
    };
    let warmup: Option<Box<dyn GradientEstimator>> =
        if out.warmup_steps > 0 { Some(Box::new(SampledSoftmax::new(n_samples)?)) } else { None };
    Ok(Built { estimator, loss, search_top, warmup })
}

/// Attaches the `[index]` of `config` to `layer` when `estimator` searches (LDGS: `output.blocks`
/// block indexes, by default D/16 or D/25, the paper's B = 8 for D = 128 and B = 4 for D = 100).
pub fn attach_index(
    layer: &mut OutputLayer,
    estimator: &dyn GradientEstimator,
    config: &Config,
    d_model: usize,
) -> Result<(), Error> {
    if !estimator.uses_index() {
        return Ok(());
    }
    let out = &config.output;
    let blocks = if out.estimator != EstimatorKind::Ldgs {
        1
    } else if out.blocks > 0 {
        out.blocks
    } else {
        default_blocks(d_model)
    };
    let upkeep = farout_layer::IndexUpkeep {
        refresh_every: config.index.refresh_every,
        rebuild_every: config.index.rebuild_every,
    };
    layer.attach_index(config.index.index_config(), blocks, upkeep)?;
    Ok(())
}

fn default_blocks(d: usize) -> usize {
    if d.is_multiple_of(16) {
        d / 16
    } else if d.is_multiple_of(25) {
        d / 25
    } else {
        1
    }
}
