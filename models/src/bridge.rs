//! Between farout's host matrices and Burn tensors.
//!
//! The output layer computes `g = dL/dphi` outside Burn. Building `g` as a constant (on the
//! non-autodiff device) and calling `backward` on the surrogate `sum(phi * g)` gives the encoder
//! exactly `g` as its upstream gradient: `d/dphi sum(phi * g) = g`.

use burn::prelude::*;
use burn::tensor::Gradients;
use farout_core::Matrix;

/// A `[rows, cols]` tensor on `device` holding `m`.
pub fn to_tensor(m: &Matrix, device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(m.as_slice().to_vec(), [m.rows(), m.cols()]), device)
}

/// The values of a 2-D float tensor as a matrix.
pub fn to_matrix(t: Tensor<2>) -> Matrix {
    let [rows, cols] = t.dims();
    let data = t.into_data();
    let values = data.try_to_vec::<f32>().expect("farout tensors are f32");
    Matrix::from_vec(rows, cols, values).expect("tensor data matches its shape")
}

/// Backpropagates the upstream gradient `dphi` (`[batch, d_model]`, from the output layer)
/// through the graph that produced `phi`.
pub fn backward_with_upstream(phi: Tensor<2>, dphi: &Matrix) -> Gradients {
    let g = to_tensor(dphi, &crate::device());
    (phi * g).sum().backward()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surrogate_loss_passes_the_upstream_gradient_exactly() {
        let x = Matrix::from_vec(2, 3, vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0]).unwrap();
        let leaf = to_tensor(&x, &crate::autodiff_device()).require_grad();
        // phi = 2 x  =>  dL/dx = 2 g
        let phi = leaf.clone() * 2.0;
        let g = Matrix::from_vec(2, 3, vec![0.1, -0.2, 0.3, 1.0, 0.0, -1.0]).unwrap();
        let grads = backward_with_upstream(phi, &g);
        let dx = to_matrix(leaf.grad(&grads).unwrap());
        for (a, b) in dx.as_slice().iter().zip(g.as_slice()) {
            assert!((a - 2.0 * b).abs() < 1e-6);
        }
    }
}
