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
///
/// burn-ndarray hands a tensor's buffer over without copying only when nothing else holds it.
/// A shared one (features kept for the backward pass, a gradient read out of `Gradients`) it
/// copies value by value through dynamic-rank indexing. Multiplying by 1, exact for every value,
/// first writes an unshared copy in one vectorised pass, off any autodiff graph (see
/// docs/decisions.md, "burn-bridge-copies").
pub fn to_matrix(t: Tensor<2>) -> Matrix {
    let [rows, cols] = t.dims();
    let data = t.detach().mul_scalar(1.0).into_data();
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

    /// A tensor read out while shared, plain or tracked, gives its values bit for bit (signed
    /// zeros, infinities, subnormals, the extremes) and leaves the tensor as it was.
    #[test]
    fn shared_tensors_are_read_bit_for_bit_and_left_unchanged() {
        let special = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-45, f32::MAX, f32::MIN, 1.5, -3.25];
        let values: Vec<f32> = (0..24).map(|i| special[i % special.len()] * if i < 10 { 1.0 } else { 0.5 }).collect();
        let x = Matrix::from_vec(4, 6, values).unwrap();
        for device in [crate::device(), crate::autodiff_device()] {
            let t = to_tensor(&x, &device);
            let bits = |m: &Matrix| m.as_slice().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&to_matrix(t.clone())), bits(&x));
            assert_eq!(bits(&to_matrix(t)), bits(&x), "the tensor read before is unchanged");
        }
    }
}
