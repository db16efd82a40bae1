use crate::{Error, bridge};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use farout_core::Matrix;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Configuration of the frozen face head (`[model]` with `encoder = "face_head"`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaceHeadConfig {
    /// Optional projection weights: a `.npy` f32 matrix `[d_in, d_out]`, applied as `x P`.
    /// Without it the head is the identity (inputs already are embeddings).
    pub projection: Option<PathBuf>,
}

/// A frozen FaceNet-style embedding head: `phi(x) = normalise(x P)` (or `normalise(x)`).
///
/// Its weights never train (`no_grad`), so features can be computed once per data set.
#[derive(Module, Debug)]
pub struct FaceHead {
    projection: Option<Linear>,
}

impl FaceHead {
    /// Builds the head for inputs of dimension `d_in`, loading the projection if configured.
    pub fn new(config: &FaceHeadConfig, d_in: usize) -> Result<Self, Error> {
        let projection = match &config.projection {
            None => None,
            Some(path) => {
                let p = farout_data::npy::read_f32_matrix(path)
                    .map_err(|e| Error::Weights { path: path.clone(), msg: e.to_string() })?;
                if p.rows() != d_in {
                    return Err(Error::Weights {
                        path: path.clone(),
                        msg: format!("projection is {} x {} but inputs have dimension {d_in}", p.rows(), p.cols()),
                    });
                }
                let dev = crate::device();
                let mut lin = LinearConfig::new(p.rows(), p.cols()).with_bias(false).init(&dev);
                lin.weight = burn::module::Param::from_tensor(bridge::to_tensor(&p, &dev));
                Some(lin.no_grad())
            }
        };
        Ok(Self { projection })
    }

    /// Output dimension for inputs of dimension `d_in`.
    pub fn d_out(&self, d_in: usize) -> usize {
        self.projection.as_ref().map_or(d_in, |l| l.weight.val().dims()[1])
    }

    /// `x: [batch, d_in] -> [batch, d_out]`, rows of unit norm.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let y = match &self.projection {
            Some(l) => l.forward(x),
            None => x,
        };
        let norm = y.clone().powf_scalar(2.0).sum_dim(1).sqrt().clamp_min(1e-12);
        y / norm
    }

    /// Embeds a whole feature matrix in batches of `batch` rows.
    pub fn embed(&self, x: &Matrix, batch: usize) -> Matrix {
        let d_out = self.d_out(x.cols());
        let mut out = Matrix::zeros(x.rows(), d_out);
        let dev = crate::device();
        for start in (0..x.rows()).step_by(batch.max(1)) {
            let end = (start + batch).min(x.rows());
            let rows = Matrix::from_vec(end - start, x.cols(), x.as_slice()[start * x.cols()..end * x.cols()].to_vec())
                .expect("slice of rows");
            let y = bridge::to_matrix(self.forward(bridge::to_tensor(&rows, &dev)));
            out.as_mut_slice()[start * d_out..end * d_out].copy_from_slice(y.as_slice());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_head_normalises_rows() {
        let head = FaceHead::new(&FaceHeadConfig::default(), 2).unwrap();
        let x = Matrix::from_vec(3, 2, vec![3.0, 4.0, 0.0, 2.0, 1.0, 1.0]).unwrap();
        let y = head.embed(&x, 2);
        assert_eq!(y.rows(), 3);
        for (a, b) in y.as_slice().iter().zip([0.6, 0.8, 0.0, 1.0, 0.70710677, 0.70710677]) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn projection_is_loaded_checked_and_applied() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proj.npy");
        // P = [[1, 0, 0], [0, 0, 2]]: x = (a, b) -> (a, 0, 2b)
        farout_data::npy::write_f32_matrix(&p, &Matrix::from_vec(2, 3, vec![1.0, 0.0, 0.0, 0.0, 0.0, 2.0]).unwrap())
            .unwrap();
        let head = FaceHead::new(&FaceHeadConfig { projection: Some(p.clone()) }, 2).unwrap();
        let y = head.embed(&Matrix::from_vec(1, 2, vec![3.0, 2.0]).unwrap(), 8);
        for (a, b) in y.as_slice().iter().zip([0.6, 0.0, 0.8]) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        let e = FaceHead::new(&FaceHeadConfig { projection: Some(p) }, 5).unwrap_err().to_string();
        assert!(e.contains("proj.npy") && e.contains("dimension 5"), "{e}");
    }
}
