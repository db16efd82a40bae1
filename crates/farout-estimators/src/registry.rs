//! The estimators a config can name: one line each in the list below, everything else beside
//! the estimator.
//!
//! Each estimator module defines its parameter struct (the keys of `[output]` it accepts, with
//! their defaults as serde defaults) and implements [`crate::EstimatorParams`] for it: validation
//! that names the key, and construction for a problem of a given shape. The registry turns the
//! list into [`EstimatorConfig`], the serde enum tagged by `estimator`
//! (`[output] estimator = "ldgs"`), which training, `farout bench` and `farout compare` all build
//! from. Adding an estimator is one new module plus one line in the list below.
//!
//! The contract the listed parameter structs implement is in `contract.rs`.

use crate::Error;
use crate::contract::{Built, EstimatorParams, ExactLoss, Problem};

farout_core::plugin_registry! {
    /// The gradient estimator of `[output]` (tag `estimator`) with its parameters.
    pub enum EstimatorConfig: EstimatorParams, tag = "estimator" {
        /// Exact cross-entropy (LDGS eq. 2).
        Softmax(crate::exact::SoftmaxConfig) = "softmax",
        /// Exact smoothed max-margin (LDGS eq. 10-11).
        Margin(crate::exact::MarginConfig) = "margin",
        /// Algorithm 1 of the LDGS paper: top-`top` retrieval, the loss on the retrieved scores.
        Mips(crate::mips::MipsConfig) = "mips",
        /// Algorithm 2 of the LDGS paper: block indexes and greedy message passing.
        Ldgs(crate::ldgs::LdgsConfig) = "ldgs",
        /// Sampled softmax (Jean et al. 2015).
        SampledSoftmax(crate::sampled::SampledSoftmaxConfig) = "sampled_softmax",
        /// word2vec's negative sampling (Mikolov et al. 2013).
        NegativeSampling(crate::sampled::NegativeSamplingConfig) = "negative_sampling",
        /// One-vs-Each bound (Titsias 2016).
        Ove(crate::ar::OveConfig) = "ove",
        /// Softmax A&R (Algorithm 1 of the A&R paper).
        ArSoftmax(crate::ar::ArSoftmaxConfig) = "ar_softmax",
        /// Multinomial probit A&R (Algorithm 2).
        ArProbit(crate::ar::ArProbitConfig) = "ar_probit",
        /// Multinomial logistic A&R (Algorithm 2).
        ArLogistic(crate::ar::ArLogisticConfig) = "ar_logistic",
    }
}

impl EstimatorConfig {
    /// Checks the parameters (errors name the key relative to `[output]`).
    pub fn check(&self) -> Result<(), farout_core::ParamError> {
        self.params().check()?;
        self.params().loss()?;
        Ok(())
    }

    /// Builds the estimator for `problem`.
    pub fn build(&self, problem: &Problem) -> Result<Built, Error> {
        self.params().build(problem)
    }

    /// The exact loss the estimator computes or approximates.
    pub fn loss(&self) -> Result<ExactLoss, Error> {
        self.params().loss()
    }

    /// See [`EstimatorParams::estimates_softmax`].
    pub fn estimates_softmax(&self) -> bool {
        self.params().estimates_softmax()
    }

    /// See [`EstimatorParams::needs_no_bias`].
    pub fn needs_no_bias(&self) -> bool {
        self.params().needs_no_bias()
    }

    /// word2vec's negative-sampling parameters when this is that estimator: skip-gram trains it
    /// lock-free, without an output layer.
    pub fn negative_sampling(&self) -> Option<&crate::sampled::NegativeSamplingConfig> {
        match self {
            Self::NegativeSampling(ns) => Some(ns),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem_counts() -> Vec<u64> {
        vec![5, 3, 0, 1]
    }

    #[test]
    fn every_registered_estimator_builds_with_its_defaults() {
        let counts = problem_counts;
        let problem = Problem { n_classes: 4, n_data: 10, dim: 32, label_counts: &counts };
        for name in EstimatorConfig::NAMES {
            let table = serde_json::json!({ "estimator": name });
            let config: EstimatorConfig = serde_json::from_value(table).unwrap();
            assert_eq!(config.name(), *name);
            config.check().unwrap();
            let built = config.build(&problem).unwrap();
            assert_eq!(built.reference().is_none(), built.exact, "{name}");
            assert_eq!(built.search.is_some(), built.estimator.uses_index(), "{name}");
        }
    }

    #[test]
    fn a_key_of_another_estimator_is_rejected() {
        let e = serde_json::from_value::<EstimatorConfig>(serde_json::json!({ "estimator": "softmax", "top": 5 }))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `top`"), "{e}");
        let e = serde_json::from_value::<EstimatorConfig>(serde_json::json!({ "estimator": "lsh" })).unwrap_err();
        assert!(e.to_string().contains("ldgs"), "{e}");
    }

    #[test]
    fn capabilities_follow_the_loss_each_estimator_trains() {
        let config = |v: serde_json::Value| -> EstimatorConfig { serde_json::from_value(v).unwrap() };
        for name in EstimatorConfig::NAMES {
            let c = config(serde_json::json!({ "estimator": name }));
            let softmax = matches!(*name, "softmax" | "sampled_softmax");
            assert_eq!(c.estimates_softmax(), softmax, "{name}");
            assert_eq!(c.needs_no_bias(), *name == "mips", "{name}");
            assert_eq!(c.negative_sampling().is_some(), *name == "negative_sampling", "{name}");
        }
        for name in ["mips", "ldgs"] {
            let c = config(serde_json::json!({ "estimator": name, "loss": "softmax" }));
            assert!(c.estimates_softmax(), "{name} with the softmax loss");
        }
    }
}
