//! Criterion benches of one output-layer training step (scores, loss gradient, dL/dphi, row
//! updates) for the exact estimators, over K. `farout bench layer --json` prints the same
//! measurement with the machine's matrix-product speed beside it.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use farout_core::{Matrix, kernels, rng};
use farout_estimators::{Batch, Exact, GradientEstimator, SmoothedMargin, Softmax};
use farout_layer::{OptimizerConfig, OutputLayer, OutputLayerConfig};
use rand::Rng as _;

const D: usize = 128;
const BATCH: usize = 256;

fn layer_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer_step");
    group.sample_size(10);
    let estimators: [(&str, Box<dyn GradientEstimator>); 2] = [
        ("softmax", Box::new(Exact::new(Softmax))),
        ("margin", Box::new(Exact::new(SmoothedMargin::new(1.0).unwrap()))),
    ];
    for k in [10_000usize, 100_000] {
        let mut r = rng::seeded(1, 0);
        let mut phi = Matrix::from_vec(BATCH, D, (0..BATCH * D).map(|_| rng::normal(&mut r)).collect()).unwrap();
        phi.as_mut_slice().chunks_exact_mut(D).for_each(|row| {
            kernels::normalize(row);
        });
        let labels: Vec<Vec<u32>> = (0..BATCH).map(|_| vec![r.random_range(0..k as u32)]).collect();
        let positives: Vec<&[u32]> = labels.iter().map(|l| l.as_slice()).collect();
        group.throughput(Throughput::Elements(BATCH as u64));
        for (name, est) in &estimators {
            let opt = OptimizerConfig::Sgd { lr: 0.1, decay: 0.0, l2: 0.0 };
            let mut layer = OutputLayer::new(
                k,
                D,
                &OutputLayerConfig { bias: true, init_std: 0.01, ..Default::default() },
                &opt,
                1,
            )
            .unwrap();
            group.bench_with_input(BenchmarkId::new(*name, k), &k, |b, _| {
                b.iter(|| layer.train_step(est.as_ref(), Batch::new(&phi, &positives), &mut r, true))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, layer_step);
criterion_main!(benches);
