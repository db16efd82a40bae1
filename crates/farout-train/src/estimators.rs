//! The gradient estimator a config's `[output]` names, and the index it searches: shared by the
//! classifier trainer and skip-gram.

use crate::Error;
use crate::config::{Config, ConfigError};
use farout_estimators::{Built, GradientEstimator, Problem, SampledSoftmax};
use farout_layer::OutputLayer;

/// The estimator of a run with its warm-up.
pub struct RunEstimator {
    /// The configured estimator with its loss and search shape.
    pub built: Built,
    /// The sampled-softmax warm-up of `output.warmup_steps`.
    pub warmup: Option<Box<dyn GradientEstimator>>,
}

/// Builds the estimator of `config.output` for `problem`; errors name the `[output]` key.
pub fn build(config: &Config, problem: &Problem) -> Result<RunEstimator, Error> {
    let out = &config.output;
    let key = |e: farout_estimators::Error| Error::Key(ConfigError::param("output", e.into()));
    let built = out.estimator.build(problem).map_err(key)?;
    let warmup: Option<Box<dyn GradientEstimator>> = if out.warmup_steps > 0 {
        let n = if out.warmup_samples > 0 { out.warmup_samples } else { (problem.n_classes / 100).max(1) };
        Some(Box::new(SampledSoftmax::new(n).map_err(key)?))
    } else {
        None
    };
    Ok(RunEstimator { built, warmup })
}

/// Attaches the `[index]` of `config` to `layer` when `built` searches (one index per block);
/// `layer` holds one of `ranks` shards of an `n_classes`-class layer
/// ([`farout_search::IndexConfig::for_shard`]).
pub fn attach_index(
    layer: &mut OutputLayer,
    built: &Built,
    config: &Config,
    n_classes: usize,
    ranks: usize,
) -> Result<(), Error> {
    if let Some(shape) = built.search {
        let index = config.index.index.for_shard(n_classes, ranks);
        layer.attach_index(index, shape.blocks, config.index.upkeep())?;
    }
    Ok(())
}
