//! Seeded synthetic data at the scales of the LDGS paper's experiments.
//!
//! - [`FaceGenerator`]: FaceNet-like embeddings (MegaFace: K = 672,000 identities, N = 4.7 M
//!   samples, D = 128). Each class has a random unit mean; a sample is
//!   `normalise(mean + noise * g / sqrt(D))` with `g` standard normal, so `noise` is the ratio of
//!   the noise norm to the mean norm. The means are independent directions by default; they can
//!   be grouped around random centres (`mean_clusters`) or, as real face embeddings are, lie near
//!   a low-dimensional subspace (`intrinsic_dim`: Gong, Boddeti & Jain, CVPR 2019, estimate the
//!   intrinsic dimension of 128-d FaceNet embeddings at about 12): `mean =
//!   normalise(B z / |z| + residual * g / sqrt(D))` with `B` a fixed random `D x r` orthonormal
//!   basis and `z` standard normal in `r` dimensions. Class sizes follow a power law (class `k` gets weight
//!   `(k + 1)^-size_exponent` on top of `min_per_class`), and each class keeps at least one
//!   training sample. Only the means (K x D) and the label lists are held in memory; sample `i`
//!   of a split is a pure function of `(seed, split, i)`, so splits are generated in parallel and
//!   streamed to disk.
//! - [`XmcGenerator`]: sparse multi-label documents with power-law label frequencies. Each label
//!   has a signature of `features_per_label` feature ids; a document draws its labels, then
//!   `features_per_sample` tokens, each from a signature of one of its labels or (with
//!   probability `noise_fraction`) from a Zipfian background vocabulary. Values are
//!   `1 + ln(count)`, rows L2-normalised.

use crate::{Dataset, Features, LabelSets, Result, SparseRows, io_err};
use farout_core::{ClassId, Matrix, ParamError, kernels, rng};
use rand::Rng as _;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Which split of a generated data set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training samples.
    Train,
    /// Held-out samples.
    Test,
}

/// Parameters of the FaceNet-like generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaceSpec {
    /// Number of identities K.
    pub n_classes: usize,
    /// Number of samples N (train + test).
    pub n_samples: usize,
    /// Embedding dimension D.
    pub dim: usize,
    /// Noise norm relative to the (unit) class mean.
    pub noise: f32,
    /// Power-law exponent of class sizes (0 = uniform).
    pub size_exponent: f64,
    /// Samples every class gets before the power-law share.
    pub min_per_class: usize,
    /// Fraction of each class's samples held out for testing.
    pub test_fraction: f64,
    /// Seed of everything random.
    pub seed: u64,
    /// Group the class means around this many random centres (0 = independent means). Real
    /// identities cluster (age, ethnicity, pose), which is what makes clustering indexes work.
    pub mean_clusters: usize,
    /// Distance of a class mean from its centre, relative to the centre's (unit) norm.
    pub cluster_spread: f32,
    /// Dimension r of the subspace the class means lie near (0 = none: isotropic means).
    /// Exclusive with `mean_clusters`.
    pub intrinsic_dim: usize,
    /// Norm of a mean's full-dimensional part relative to its (unit) subspace part.
    pub residual: f32,
}

impl Default for FaceSpec {
    fn default() -> Self {
        Self {
            n_classes: 10_000,
            n_samples: 100_000,
            dim: 128,
            noise: 1.5,
            size_exponent: 0.5,
            min_per_class: 2,
            test_fraction: 0.2,
            seed: 1,
            mean_clusters: 0,
            cluster_spread: 1.0,
            intrinsic_dim: 0,
            residual: 0.5,
        }
    }
}

impl FaceSpec {
    /// Bytes the generator holds: the class means and the label lists of both splits.
    pub fn generator_bytes(&self) -> u128 {
        4 * self.n_classes as u128 * self.dim as u128 + 16 * self.n_classes as u128 + 8 * self.n_samples as u128
    }

    /// Bytes of all samples' features as f32 (in memory, or in the `.npy` files).
    pub fn features_bytes(&self) -> u128 {
        4 * self.n_samples as u128 * self.dim as u128
    }

    /// A tightly clustered task: `k` class means of dimension `d` in `k / 50` clusters (spread
    /// 0.7) and `2k` samples with noise 0.5 — what the index and LDGS tests search.
    pub fn clustered(k: usize, d: usize) -> Self {
        Self {
            n_classes: k,
            n_samples: 2 * k,
            dim: d,
            mean_clusters: k / 50,
            cluster_spread: 0.7,
            noise: 0.5,
            ..Self::default()
        }
    }

    /// The MegaFace-sized set of the LDGS paper (672 K identities, 4.7 M samples, D = 128).
    pub fn megaface() -> Self {
        Self { n_classes: 672_000, n_samples: 4_700_000, ..Self::default() }
    }

    fn check(&self) -> std::result::Result<(), ParamError> {
        let p = |name, msg: String| Err(ParamError::message(name, msg));
        for (key, n) in [("n_classes", self.n_classes), ("dim", self.dim)] {
            if n == 0 {
                return p(key, "must be > 0".into());
            }
        }
        if self.min_per_class == 0 || self.n_samples < self.n_classes * self.min_per_class {
            return p(
                "n_samples",
                format!(
                    "{} samples cannot give {} classes {} each (min_per_class >= 1)",
                    self.n_samples, self.n_classes, self.min_per_class
                ),
            );
        }
        if !(0.0..1.0).contains(&self.test_fraction) {
            return p("test_fraction", format!("{} is not in [0, 1)", self.test_fraction));
        }
        if !(self.cluster_spread >= 0.0 && self.cluster_spread.is_finite()) {
            return p("cluster_spread", format!("{} is not a finite number >= 0", self.cluster_spread));
        }
        if self.intrinsic_dim > self.dim {
            return p("intrinsic_dim", format!("{} is larger than dim {}", self.intrinsic_dim, self.dim));
        }
        if self.intrinsic_dim > 0 && self.mean_clusters > 0 {
            return p("intrinsic_dim", "set either mean_clusters or intrinsic_dim, not both".into());
        }
        if !(self.residual >= 0.0 && self.residual.is_finite()) {
            return p("residual", format!("{} is not a finite number >= 0", self.residual));
        }
        if !(self.noise >= 0.0 && self.noise.is_finite()) {
            return p("noise", format!("{} is not a finite number >= 0", self.noise));
        }
        Ok(())
    }
}

/// `r` orthonormal vectors of dimension `d` (the rows of an `r x d` matrix): seeded Gaussian
/// vectors, orthonormalised.
fn subspace_basis(d: usize, r: usize, seed: u64) -> Matrix {
    let mut g = rng::seeded(seed ^ 0xBA515, 0);
    let mut b = Matrix::from_vec(r, d, (0..r * d).map(|_| rng::normal(&mut g)).collect()).expect("r x d values");
    b.orthonormalize_rows();
    b
}

/// Integer sizes summing to `total`: `min` each plus a share proportional to `(k+1)^-exponent`.
fn power_law_sizes(n: usize, total: usize, min: usize, exponent: f64) -> Vec<usize> {
    let weights: Vec<f64> = (0..n).map(|k| ((k + 1) as f64).powf(-exponent)).collect();
    let sum: f64 = weights.iter().sum();
    let extra = total - n * min;
    let mut sizes: Vec<usize> = weights.iter().map(|w| min + (extra as f64 * w / sum).floor() as usize).collect();
    let mut left = total - sizes.iter().sum::<usize>();
    let mut k = 0;
    while left > 0 {
        sizes[k % n] += 1;
        left -= 1;
        k += 1;
    }
    sizes
}

/// The FaceNet-like generator (see the module docs).
#[derive(Debug)]
pub struct FaceGenerator {
    spec: FaceSpec,
    means: Matrix,
    train: Vec<ClassId>,
    test: Vec<ClassId>,
}

impl FaceGenerator {
    /// Draws the class means and the (shuffled) label lists of both splits.
    pub fn new(spec: FaceSpec) -> Result<Self> {
        spec.check()?;
        let (k, d) = (spec.n_classes, spec.dim);
        let centre = |j: usize, row: &mut [f32]| {
            let mut r = rng::seeded(spec.seed ^ 0xCE17, j as u64);
            row.iter_mut().for_each(|x| *x = rng::normal(&mut r));
            kernels::normalize(row);
        };
        let basis = subspace_basis(d, spec.intrinsic_dim, spec.seed);
        let mut means = Matrix::zeros(k, d);
        means.as_mut_slice().par_chunks_mut(d).enumerate().for_each(|(c, row)| {
            let mut r = rng::seeded(spec.seed, c as u64);
            if spec.intrinsic_dim > 0 {
                // mean = normalise(B z / |z| + residual * g / sqrt(D))
                let mut z: Vec<f32> = (0..spec.intrinsic_dim).map(|_| rng::normal(&mut r)).collect();
                kernels::normalize(&mut z);
                row.fill(0.0);
                for (zj, bj) in z.iter().zip(basis.iter_rows()) {
                    kernels::axpy(*zj, bj, row);
                }
                let scale = spec.residual / (d as f32).sqrt();
                row.iter_mut().for_each(|x| *x += scale * rng::normal(&mut r));
            } else if spec.mean_clusters == 0 {
                row.iter_mut().for_each(|x| *x = rng::normal(&mut r));
            } else {
                // mean = normalise(centre + spread * g / sqrt(D)), centre = c mod n_clusters
                centre(c % spec.mean_clusters, row);
                let scale = spec.cluster_spread / (d as f32).sqrt();
                row.iter_mut().for_each(|x| *x += scale * rng::normal(&mut r));
            }
            kernels::normalize(row);
        });
        let sizes = power_law_sizes(k, spec.n_samples, spec.min_per_class, spec.size_exponent);
        let mut r = rng::seeded(spec.seed, u64::MAX);
        let (mut train, mut test) = (Vec::new(), Vec::new());
        for (c, &n) in sizes.iter().enumerate() {
            let n_test = ((n as f64 * spec.test_fraction + r.random::<f64>()).floor() as usize).min(n - 1);
            train.extend(std::iter::repeat_n(c as ClassId, n - n_test));
            test.extend(std::iter::repeat_n(c as ClassId, n_test));
        }
        rng::shuffle(&mut train, &mut r);
        rng::shuffle(&mut test, &mut r);
        Ok(Self { spec, means, train, test })
    }

    /// The parameters.
    pub fn spec(&self) -> &FaceSpec {
        &self.spec
    }

    /// The class means (K x D, unit rows).
    pub fn means(&self) -> &Matrix {
        &self.means
    }

    /// Labels of a split, one per sample.
    pub fn labels(&self, split: Split) -> &[ClassId] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// Writes sample `i` of `split` into `out` (length D).
    pub fn sample_into(&self, split: Split, i: usize, out: &mut [f32]) {
        let stream = (i as u64) << 1 | (split == Split::Test) as u64;
        let mut r = rng::seeded(self.spec.seed ^ 0x5EED_FACE, stream);
        let c = self.labels(split)[i] as usize;
        let scale = self.spec.noise / (self.spec.dim as f32).sqrt();
        for (o, m) in out.iter_mut().zip(self.means.row(c)) {
            *o = m + scale * rng::normal(&mut r);
        }
        kernels::normalize(out);
    }

    /// Rows `range` of a split as a matrix.
    pub fn features(&self, split: Split, range: std::ops::Range<usize>) -> Matrix {
        let d = self.spec.dim;
        let mut m = Matrix::zeros(range.len(), d);
        m.as_mut_slice()
            .par_chunks_mut(d)
            .enumerate()
            .for_each(|(j, row)| self.sample_into(split, range.start + j, row));
        m
    }

    /// A whole split in memory.
    pub fn dataset(&self, split: Split) -> Dataset {
        let labels = self.labels(split);
        Dataset {
            features: Features::Dense(self.features(split, 0..labels.len())),
            labels: LabelSets::from_single(labels.to_vec(), self.spec.n_classes),
        }
    }

    /// Writes `train.npy`, `train.labels.npy`, `test.npy`, `test.labels.npy` and `means.npy` into
    /// `dir`, streaming in chunks; `progress` is called with the number of samples written.
    pub fn write(&self, dir: &Path, mut progress: impl FnMut(usize)) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        const CHUNK: usize = 65_536;
        for (split, name) in [(Split::Train, "train"), (Split::Test, "test")] {
            let n = self.labels(split).len();
            let mut w = crate::npy::MatrixWriter::create(&dir.join(format!("{name}.npy")), n, self.spec.dim)?;
            for start in (0..n).step_by(CHUNK) {
                let m = self.features(split, start..(start + CHUNK).min(n));
                w.write_rows(m.as_slice())?;
                progress(m.rows());
            }
            w.finish()?;
            crate::npy::write_ids(&dir.join(format!("{name}.labels.npy")), self.labels(split))?;
        }
        crate::npy::write_f32_matrix(&dir.join("means.npy"), &self.means)
    }
}

/// Parameters of the sparse multi-label generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct XmcSpec {
    /// Number of documents (train + test).
    pub n_samples: usize,
    /// Vocabulary size.
    pub n_features: usize,
    /// Number of labels K.
    pub n_labels: usize,
    /// Mean labels per document (at least 1).
    pub labels_per_sample: f64,
    /// Power-law exponent of label frequencies.
    pub label_exponent: f64,
    /// Size of each label's feature signature.
    pub features_per_label: usize,
    /// Tokens drawn per document.
    pub features_per_sample: usize,
    /// Probability that a token is background noise.
    pub noise_fraction: f64,
    /// Fraction of documents held out.
    pub test_fraction: f64,
    /// Seed of everything random.
    pub seed: u64,
}

impl Default for XmcSpec {
    fn default() -> Self {
        Self {
            n_samples: 20_000,
            n_features: 20_000,
            n_labels: 1_000,
            labels_per_sample: 3.2,
            label_exponent: 1.0,
            features_per_label: 20,
            features_per_sample: 60,
            noise_fraction: 0.5,
            test_fraction: 0.2,
            seed: 1,
        }
    }
}

impl XmcSpec {
    /// Bytes the generator holds: the cumulative distributions of labels and features.
    pub fn generator_bytes(&self) -> u128 {
        8 * (self.n_labels as u128 + self.n_features as u128)
    }

    /// Bytes of the documents, in memory as sparse rows (8 bytes per feature, 4 per label) or as
    /// text (at most 12 characters per `index:value`, 8 per label).
    pub fn data_bytes(&self) -> u128 {
        let per_doc = 12.0 * self.features_per_sample as f64 + 8.0 * self.labels_per_sample.ceil() + 2.0;
        self.n_samples as u128 * per_doc as u128
    }
}

/// Inverse-CDF sampler for weights `(k+1)^-exponent`.
struct PowerLaw {
    cdf: Vec<f64>,
}

impl PowerLaw {
    fn new(n: usize, exponent: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|k| {
                acc += ((k + 1) as f64).powf(-exponent);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Self { cdf }
    }

    fn draw(&self, r: &mut rng::Rng) -> u32 {
        let u: f64 = r.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32
    }
}

/// The sparse multi-label generator (see the module docs).
pub struct XmcGenerator {
    spec: XmcSpec,
    labels: PowerLaw,
    background: PowerLaw,
    n_test: usize,
}

impl XmcGenerator {
    /// Validates `spec` and builds the samplers.
    pub fn new(spec: XmcSpec) -> Result<Self> {
        let p = |name: &'static str, msg: String| -> Result<Self> { Err(ParamError::message(name, msg).into()) };
        let counts = [
            ("n_samples", spec.n_samples),
            ("n_features", spec.n_features),
            ("n_labels", spec.n_labels),
            ("features_per_label", spec.features_per_label),
            ("features_per_sample", spec.features_per_sample),
        ];
        if let Some(&(key, _)) = counts.iter().find(|(_, n)| *n == 0) {
            return p(key, "must be > 0".into());
        }
        if !(spec.labels_per_sample >= 1.0) {
            return p("labels_per_sample", format!("{} must be >= 1", spec.labels_per_sample));
        }
        if !(0.0..1.0).contains(&spec.test_fraction) {
            return p("test_fraction", format!("{} must lie in [0, 1)", spec.test_fraction));
        }
        if !(0.0..=1.0).contains(&spec.noise_fraction) {
            return p("noise_fraction", format!("{} must lie in [0, 1]", spec.noise_fraction));
        }
        let n_test = (spec.n_samples as f64 * spec.test_fraction).round() as usize;
        Ok(Self {
            labels: PowerLaw::new(spec.n_labels, spec.label_exponent),
            background: PowerLaw::new(spec.n_features, 1.0),
            n_test,
            spec,
        })
    }

    /// Number of documents in a split (the last `test_fraction` are the test split).
    pub fn len(&self, split: Split) -> usize {
        match split {
            Split::Train => self.spec.n_samples - self.n_test,
            Split::Test => self.n_test,
        }
    }

    /// Feature `j` of label `l`'s signature: a hash, so nothing per label is stored.
    fn signature(&self, l: u32, j: usize) -> u32 {
        (rng::splitmix64(self.spec.seed ^ ((l as u64) << 20 | j as u64)) % self.spec.n_features as u64) as u32
    }

    /// Document `i` (0-based over train then test): labels and sparse features.
    pub fn document(&self, i: usize, labels: &mut Vec<u32>, cols: &mut Vec<u32>, vals: &mut Vec<f32>) {
        let mut r = rng::seeded(self.spec.seed ^ 0xD0C5, i as u64);
        // 1 + Poisson(mean - 1) labels, by inversion (means here are small).
        let lambda = self.spec.labels_per_sample - 1.0;
        let (mut n, mut p, u) = (0usize, (-lambda).exp(), r.random::<f64>());
        let mut cdf = p;
        while u > cdf && n < 64 {
            n += 1;
            p *= lambda / n as f64;
            cdf += p;
        }
        let n_labels = (1 + n).min(self.spec.n_labels);
        labels.clear();
        while labels.len() < n_labels {
            let l = self.labels.draw(&mut r);
            if !labels.contains(&l) {
                labels.push(l);
            }
        }
        labels.sort_unstable();
        cols.clear();
        for _ in 0..self.spec.features_per_sample {
            let f = if r.random::<f64>() < self.spec.noise_fraction {
                self.background.draw(&mut r)
            } else {
                let l = labels[r.random_range(0..labels.len())];
                self.signature(l, r.random_range(0..self.spec.features_per_label))
            };
            cols.push(f);
        }
        cols.sort_unstable();
        vals.clear();
        let mut w = 0;
        for j in 0..cols.len() {
            if j > 0 && cols[j] == cols[w - 1] {
                vals[w - 1] += 1.0;
            } else {
                cols[w] = cols[j];
                vals.push(1.0);
                w += 1;
            }
        }
        cols.truncate(w);
        vals.iter_mut().for_each(|v| *v = 1.0 + v.ln());
        kernels::normalize(vals);
    }

    fn offset(&self, split: Split) -> usize {
        if split == Split::Train { 0 } else { self.len(Split::Train) }
    }

    /// A split in memory.
    pub fn dataset(&self, split: Split) -> Dataset {
        let n = self.len(split);
        let off = self.offset(split);
        let docs: Vec<(Vec<u32>, Vec<u32>, Vec<f32>)> = (0..n)
            .into_par_iter()
            .map(|i| {
                let (mut l, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
                self.document(off + i, &mut l, &mut c, &mut v);
                (l, c, v)
            })
            .collect();
        let mut features = SparseRows::new(self.spec.n_features);
        let mut labels = LabelSets::new(self.spec.n_labels);
        for (l, c, v) in docs {
            labels.push(&l);
            features.push_row(&c, &v);
        }
        Dataset { features: Features::Sparse(features), labels }
    }

    /// Writes `train.txt` and `test.txt` in XMC format into `dir`, streaming.
    pub fn write(&self, dir: &Path, mut progress: impl FnMut(usize)) -> Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        const CHUNK: usize = 16_384;
        for (split, name) in [(Split::Train, "train.txt"), (Split::Test, "test.txt")] {
            let path = dir.join(name);
            let mut w =
                std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).map_err(io_err(&path))?);
            writeln!(w, "{} {} {}", self.len(split), self.spec.n_features, self.spec.n_labels)
                .map_err(io_err(&path))?;
            let (n, off) = (self.len(split), self.offset(split));
            for start in (0..n).step_by(CHUNK) {
                let lines: Vec<Vec<u8>> = (start..(start + CHUNK).min(n))
                    .into_par_iter()
                    .map(|i| {
                        let (mut l, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
                        self.document(off + i, &mut l, &mut c, &mut v);
                        let mut line = Vec::new();
                        crate::xmc::write_row(&mut line, &l, (&c, &v)).expect("writing to memory");
                        line
                    })
                    .collect();
                for line in &lines {
                    w.write_all(line).map_err(io_err(&path))?;
                }
                progress(lines.len());
            }
            w.flush().map_err(io_err(&path))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn face_sizes_follow_the_spec() {
        let spec = FaceSpec { n_classes: 100, n_samples: 1000, dim: 16, ..FaceSpec::default() };
        let g = FaceGenerator::new(spec).unwrap();
        assert_eq!(g.labels(Split::Train).len() + g.labels(Split::Test).len(), 1000);
        let mut counts = vec![0; 100];
        g.labels(Split::Train).iter().for_each(|&c| counts[c as usize] += 1);
        assert!(counts.iter().all(|&c| c >= 1), "every class keeps a training sample");
        assert!(counts[0] > counts[99], "power law: class 0 is the largest");
        let test = g.labels(Split::Test).len() as f64 / 1000.0;
        assert!((test - 0.2).abs() < 0.05, "test fraction {test}");
    }

    #[test]
    fn face_samples_are_unit_deterministic_and_near_their_mean() {
        let spec = FaceSpec { n_classes: 50, n_samples: 500, dim: 64, noise: 0.5, ..FaceSpec::default() };
        let g = FaceGenerator::new(spec.clone()).unwrap();
        let a = g.features(Split::Train, 0..100);
        let b = FaceGenerator::new(spec).unwrap().features(Split::Train, 0..100);
        assert_eq!(a, b);
        let mut nearest_is_own = 0;
        for i in 0..100 {
            assert!((kernels::norm(a.row(i)) - 1.0).abs() < 1e-5);
            let own = g.labels(Split::Train)[i] as usize;
            let best = (0..50)
                .max_by(|&x, &y| {
                    kernels::dot(g.means().row(x), a.row(i)).total_cmp(&kernels::dot(g.means().row(y), a.row(i)))
                })
                .unwrap();
            nearest_is_own += (best == own) as usize;
        }
        assert!(nearest_is_own >= 95, "noise 0.5 keeps samples near their mean: {nearest_is_own}/100");
    }

    #[test]
    fn clustered_means_are_closer_within_a_cluster() {
        let spec = FaceSpec {
            n_classes: 400,
            n_samples: 800,
            dim: 64,
            mean_clusters: 20,
            cluster_spread: 0.5,
            ..FaceSpec::default()
        };
        let g = FaceGenerator::new(spec).unwrap();
        let m = g.means();
        let (mut within, mut across) = (0.0, 0.0);
        for c in 0..20 {
            within += kernels::dot(m.row(c), m.row(c + 20)); // same centre (c mod 20)
            across += kernels::dot(m.row(c), m.row(c + 1)); // neighbouring centres
        }
        assert!(within / 20.0 > 0.7 && (across / 20.0f32).abs() < 0.2, "within {within} across {across}");
    }

    #[test]
    fn facenet_means_lie_near_their_subspace() {
        let spec = FaceSpec { n_classes: 2000, n_samples: 4000, dim: 64, intrinsic_dim: 6, ..FaceSpec::default() };
        let g = FaceGenerator::new(spec).unwrap();
        let b = subspace_basis(64, 6, 1);
        for i in 0..6 {
            for j in 0..6 {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((kernels::dot(b.row(i), b.row(j)) - want).abs() < 1e-5, "basis {i} {j}");
            }
        }
        // |projection|^2 of a unit mean = 1 / (1 + residual^2) in expectation (0.8): the rest of
        // the norm is the full-dimensional residual, about 6/64 of which also falls in the span.
        let mut in_span = 0.0;
        for c in 0..2000 {
            let m = g.means().row(c);
            assert!((kernels::norm(m) - 1.0).abs() < 1e-5);
            in_span += (0..6).map(|j| kernels::dot(m, b.row(j)).powi(2)).sum::<f32>();
        }
        let mean = in_span / 2000.0;
        let expect = (1.0 + 0.25 * 6.0 / 64.0) / 1.25;
        assert!((mean - expect).abs() < 0.02, "mean squared projection {mean}, expected {expect}");
        let small = FaceSpec { n_classes: 100, n_samples: 200, dim: 16, intrinsic_dim: 4, ..FaceSpec::default() };
        let bad = FaceSpec { mean_clusters: 10, ..small.clone() };
        assert!(FaceGenerator::new(bad).unwrap_err().to_string().contains("intrinsic_dim"));
        let bad = FaceSpec { intrinsic_dim: 17, ..small };
        assert!(FaceGenerator::new(bad).unwrap_err().to_string().contains("intrinsic_dim"));
    }

    #[test]
    fn xmc_documents_are_valid_and_label_dependent() {
        let spec = XmcSpec { n_samples: 2000, n_features: 5000, n_labels: 200, ..XmcSpec::default() };
        let g = XmcGenerator::new(spec).unwrap();
        let d = g.dataset(Split::Train);
        assert_eq!(d.len(), 1600);
        let Features::Sparse(f) = &d.features else { panic!() };
        let mean_labels = d.labels.labels.len() as f64 / d.len() as f64;
        assert!((mean_labels - 3.2).abs() < 0.2, "{mean_labels}");
        for i in 0..d.len() {
            let (c, v) = f.row(i);
            assert!(c.windows(2).all(|w| w[0] < w[1]) && c.iter().all(|&x| (x as usize) < 5000));
            assert!((kernels::norm(v) - 1.0).abs() < 1e-5);
            // A label's signature features show up in its documents.
            let l = d.labels.get(i)[0];
            let sig: Vec<u32> = (0..20).map(|j| g.signature(l, j)).collect();
            assert!(d.labels.get(i).len() > 3 || c.iter().any(|x| sig.contains(x)));
        }
    }

    #[test]
    fn written_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let g = XmcGenerator::new(XmcSpec { n_samples: 300, ..XmcSpec::default() }).unwrap();
        g.write(dir.path(), |_| {}).unwrap();
        assert_eq!(crate::xmc::read(&dir.path().join("train.txt")).unwrap(), g.dataset(Split::Train));
        let f = FaceGenerator::new(FaceSpec { n_classes: 10, n_samples: 100, dim: 8, ..FaceSpec::default() }).unwrap();
        f.write(dir.path(), |_| {}).unwrap();
        let m = crate::npy::read_f32_matrix(&dir.path().join("test.npy")).unwrap();
        assert_eq!(m, f.features(Split::Test, 0..f.labels(Split::Test).len()));
        assert_eq!(crate::npy::read_ids(&dir.path().join("train.labels.npy")).unwrap(), f.labels(Split::Train));
    }
}
