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
        let (d, d_out) = (x.cols(), self.d_out(x.cols()));
        let mut out = Matrix::zeros(x.rows(), d_out);
        for start in (0..x.rows()).step_by(batch.max(1)) {
            let end = (start + batch).min(x.rows());
            let y = self.embed_rows(&x.as_slice()[start * d..end * d], d);
            out.as_mut_slice()[start * d_out..end * d_out].copy_from_slice(y.as_slice());
        }
        out
    }

    /// [`FaceHead::embed`] into `x` itself: where the head keeps the width (the identity, a
    /// square projection) each batch's embeddings overwrite its rows, so a data set is never
    /// held twice (at MegaFace scale the training features are 1.9 GB).
    pub fn embed_in_place(&self, x: &mut Matrix, batch: usize) {
        if self.d_out(x.cols()) != x.cols() {
            *x = self.embed(x, batch);
            return;
        }
        let d = x.cols();
        for start in (0..x.rows()).step_by(batch.max(1)) {
            let end = (start + batch).min(x.rows());
            let y = self.embed_rows(&x.as_slice()[start * d..end * d], d);
            x.as_mut_slice()[start * d..end * d].copy_from_slice(y.as_slice());
        }
    }

    /// The embeddings of `rows` (row-major, `d` wide).
    fn embed_rows(&self, rows: &[f32], d: usize) -> Matrix {
        let rows = Matrix::from_vec(rows.len() / d.max(1), d, rows.to_vec()).expect("whole rows");
        bridge::to_matrix(self.forward(bridge::to_tensor(&rows, &crate::device())))
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

    /// In place gives what `embed` gives, for the identity, a square projection and one that
    /// changes the width, with a last batch shorter than the others.
    #[test]
    fn embedding_in_place_equals_embedding_into_a_new_matrix() {
        let dir = tempfile::tempdir().unwrap();
        let x = Matrix::from_vec(5, 2, vec![3.0, 4.0, 0.0, 2.0, 1.0, 1.0, -2.0, 5.0, 0.5, -0.25]).unwrap();
        let square = dir.path().join("square.npy");
        farout_data::npy::write_f32_matrix(&square, &Matrix::from_vec(2, 2, vec![1.0, 2.0, -1.0, 0.5]).unwrap())
            .unwrap();
        let wide = dir.path().join("wide.npy");
        farout_data::npy::write_f32_matrix(&wide, &Matrix::from_vec(2, 3, vec![1.0, 0.0, 3.0, 0.0, 2.0, 1.0]).unwrap())
            .unwrap();
        for projection in [None, Some(square), Some(wide)] {
            let head = FaceHead::new(&FaceHeadConfig { projection }, 2).unwrap();
            let mut y = x.clone();
            head.embed_in_place(&mut y, 2);
            assert_eq!(y, head.embed(&x, 2));
            assert_ne!(y, x);
        }
    }
}
