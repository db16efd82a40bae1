use crate::{Error, bridge};
use burn::module::{Module, Param};
use burn::optim::{AdaGradConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::prelude::*;
use farout_core::binio::{read_f32s, read_u64, write_f32s, write_u64};
use farout_core::{Matrix, ParamError, rng};
use farout_layer::{Optimizer, OptimizerConfig};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Nonlinearity of the hidden layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `h` as is (fastText's choice: the document vector is linear in its words).
    #[default]
    None,
    /// `max(h, 0)`.
    Relu,
    /// `tanh(h)`.
    Tanh,
}

/// How the document encoder runs when the output layer is class-sharded over MPI ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncoderRanks {
    /// Data parallel: each rank encodes its share of the batch, the ranks gather the features,
    /// and the encoder's gradients (the table rows the ranks' documents used, and the bias) are
    /// summed over the ranks before every rank applies them. The encoder's work is split; its
    /// features and gradients cross the ranks every step.
    Data,
    /// Replicated: every rank encodes the whole batch and, from the summed `dL/dphi`, takes
    /// the same step as one process; nothing of the encoder crosses the ranks. The default:
    /// a bag of words costs about one multiply-add per value of the gradient rows that data
    /// parallelism would move, so moving them costs more than computing them twice.
    #[default]
    Replicated,
}

/// Configuration of the document encoder (`[model]` with `encoder = "doc_encoder"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DocEncoderConfig {
    /// Output dimension D of the hidden layer.
    pub d_model: usize,
    /// Nonlinearity after the bias.
    pub activation: Activation,
    /// Standard deviation of the normal initialisation of the input table.
    pub init_std: f32,
    /// Optimiser of the input table rows (sparse) and of the hidden bias.
    pub optimizer: OptimizerConfig,
    /// Input dropout: during training each word of a document is dropped with this
    /// probability and the kept ones are scaled by `1 / (1 - dropout)` (inverted dropout).
    pub dropout: f32,
    /// How the encoder runs beside a class-sharded layer (MPI ranks); one process ignores it.
    pub ranks: EncoderRanks,
}

impl Default for DocEncoderConfig {
    fn default() -> Self {
        Self {
            d_model: 100,
            activation: Activation::None,
            init_std: 0.1,
            optimizer: OptimizerConfig::default(),
            dropout: 0.0,
            ranks: EncoderRanks::Replicated,
        }
    }
}

/// The Burn part of the encoder: the hidden bias.
#[derive(Module, Debug)]
struct Hidden {
    bias: Param<Tensor<1>>,
}

impl DocEncoderConfig {
    /// The ranges `farout tune` draws from (keys relative to `[model.doc_encoder]`): the
    /// dimension D (multiples of 4, so that 1, 2 or 4 LDGS blocks divide it) and the
    /// optimiser's step size.
    pub fn search_space(&self) -> Vec<farout_core::space::Dim> {
        use farout_core::space::{Dim, Value};
        let dims = [64, 100, 128, 256].into_iter().map(Value::Int).collect();
        let mut space = vec![Dim::choice("d_model", dims)];
        space.extend(self.optimizer.search_space().into_iter().map(|d| d.under("optimizer")));
        space
    }

    /// Checks the parameters; errors name the key relative to `[model.doc_encoder]`.
    pub fn check(&self) -> Result<(), ParamError> {
        if self.d_model == 0 {
            return Err(ParamError::message("d_model", "must be > 0"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ParamError::message("dropout", format!("{} is not in [0, 1)", self.dropout)));
        }
        if !(self.init_std >= 0.0) {
            return Err(ParamError::message("init_std", format!("{} must be >= 0", self.init_std)));
        }
        if let OptimizerConfig::ArSchedule { .. } = self.optimizer {
            return Err(ParamError::message(
                "optimizer.kind",
                "`ar_schedule` is an output-layer schedule; the encoder takes `sgd` or `adagrad`",
            ));
        }
        // `[model.doc_encoder]` writes the optimiser's value and range after a colon
        // (``key `model.doc_encoder.optimizer.lr`: 0 must be ...``), as it always has.
        self.optimizer.check().map_err(|e| match e.value {
            Some(value) => ParamError::message(format!("optimizer.{}", e.name), format!("{value} {}", e.reason)),
            None => e.under("optimizer"),
        })
    }
}

/// Words ahead whose table row the bag sum requests while adding the current one.
const BAG_AHEAD: usize = 8;

/// One hidden layer over a sparse bag of words: `phi(x) = act(sum_f x_f E_f + b)`.
///
/// `E` (vocabulary x D) is the big table. Burn's embedding gradient is dense (V x D per step), so
/// `E` lives outside Burn: a batch sums the rows of its documents into bags (a leaf tensor of
/// `[batch, D]`), Burn computes the gradient of the bags, and each used row of `E` gets
/// `sum x_f dL/dbag` and is updated in place with a sparse optimiser. The bias and the
/// nonlinearity run in Burn.
pub struct DocEncoder {
    config: DocEncoderConfig,
    table: Matrix,
    table_opt: Optimizer,
    hidden: Option<Hidden>,
    hidden_opt: ModuleOptimizer,
}

/// A forward pass kept for the backward pass.
pub struct DocForward {
    /// Features `[batch, d_model]` (tracked by autodiff).
    pub phi: Tensor<2>,
    /// The bags `sum_f x_f E_f`, `[batch, d_model]`: the leaf of Burn's graph.
    bag: Tensor<2>,
    /// The features the batch uses, ascending.
    uniq: Vec<u32>,
    /// Every (document, feature, value) of the batch.
    entries: Vec<BagEntry>,
}

/// The gradients of a batch's loss with respect to the encoder ([`DocEncoder::gradients`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DocGrads {
    /// The table rows the batch used, ascending.
    pub features: Vec<u32>,
    /// `dL/dE_f` for each of `features` (`[features, d_model]`).
    pub rows: Matrix,
    /// `dL/db` of the hidden bias (`d_model` values).
    pub bias: Vec<f32>,
}

impl DocGrads {
    /// The sum of several batches' gradients (of one encoder): the union of their rows, each
    /// row the sum of its gradients in the order given.
    pub fn add(parts: &[DocGrads]) -> DocGrads {
        let d = parts.first().map_or(0, |p| p.bias.len());
        let mut features: Vec<u32> = parts.iter().flat_map(|p| p.features.iter().copied()).collect();
        features.sort_unstable();
        features.dedup();
        let mut rows = Matrix::zeros(features.len(), d);
        let mut bias = vec![0.0; d];
        for p in parts {
            for (j, &f) in p.features.iter().enumerate() {
                let at = features.binary_search(&f).expect("every feature is in the union");
                farout_core::kernels::axpy(1.0, p.rows.row(j), rows.row_mut(at));
            }
            farout_core::kernels::axpy(1.0, &p.bias, &mut bias);
        }
        DocGrads { features, rows, bias }
    }
}

/// One non-zero of a batch: document `doc` has value `x` at feature `uniq[at]`.
struct BagEntry {
    doc: u32,
    at: u32,
    x: f32,
}

impl DocEncoder {
    /// An encoder over a vocabulary of `n_features`, initialised from `seed`.
    pub fn new(config: &DocEncoderConfig, n_features: usize, seed: u64) -> Result<Self, Error> {
        config.check()?;
        let d = config.d_model;
        let mut table = Matrix::zeros(n_features, d);
        let mut r = rng::seeded(seed, 0x7AB1E);
        table.as_mut_slice().iter_mut().for_each(|x| *x = config.init_std * rng::normal(&mut r));
        let hidden = Hidden { bias: Param::from_tensor(Tensor::zeros([d], &crate::autodiff_device())) };
        let hidden_opt = match config.optimizer {
            OptimizerConfig::Sgd { .. } => SgdConfig::new().init(),
            OptimizerConfig::Adagrad { eps, .. } => AdaGradConfig::new().with_epsilon(eps).init(),
            OptimizerConfig::ArSchedule { .. } => unreachable!("DocEncoderConfig::check rejects ar_schedule"),
        };
        Ok(Self {
            config: config.clone(),
            table_opt: config.optimizer.build(n_features, d),
            table,
            hidden: Some(hidden),
            hidden_opt,
        })
    }

    /// Output dimension D.
    pub fn d_model(&self) -> usize {
        self.config.d_model
    }

    /// The input table (vocabulary x D).
    pub fn table(&self) -> &Matrix {
        &self.table
    }

    /// Bytes held by the table and its optimiser state.
    pub fn memory_bytes(&self) -> usize {
        self.table.bytes() * if self.table_opt.is_adaptive() { 2 } else { 1 }
    }

    /// The hidden layer's bias (D values).
    pub fn hidden_bias(&self) -> Vec<f32> {
        bridge::to_matrix(self.hidden().bias.val().unsqueeze::<2>()).into_vec()
    }

    fn hidden(&self) -> &Hidden {
        self.hidden.as_ref().expect("hidden module is present between steps")
    }

    /// Forward pass of a batch of documents (each `(feature ids, values)`) on `device`.
    fn forward_on(&self, docs: &[(&[u32], &[f32])], device: &Device, track: bool) -> DocForward {
        let d = self.d_model();
        // The bag `sum_f x_f E_f` of every document, here: its gradient with respect to `E` is
        // sparse, and scattering it row by row beats Burn's gather and scatter-add.
        let mut uniq: Vec<u32> = docs.iter().flat_map(|(c, _)| c.iter().copied()).collect();
        uniq.sort_unstable();
        uniq.dedup();
        let mut bag = Matrix::zeros(docs.len(), d);
        let mut entries = Vec::with_capacity(docs.iter().map(|(c, _)| c.len()).sum());
        // The table rows are scattered over a large table: each is requested a few words ahead,
        // so that their loads overlap instead of waiting one by one.
        let mut ahead = docs.iter().flat_map(|(c, _)| c.iter()).skip(BAG_AHEAD);
        for (i, (cols, v)) in docs.iter().enumerate() {
            for (&c, &x) in cols.iter().zip(*v) {
                if let Some(&next) = ahead.next() {
                    farout_core::kernels::prefetch(self.table.row(next as usize));
                }
                farout_core::kernels::axpy(x, self.table.row(c as usize), bag.row_mut(i));
                let at = uniq.binary_search(&c).expect("every feature is in uniq") as u32;
                entries.push(BagEntry { doc: i as u32, at, x });
            }
        }
        let mut h = bridge::to_tensor(&bag, device);
        if track {
            h = h.require_grad();
        }
        let bias = self.hidden().bias.val();
        let bias = if track { bias } else { Tensor::from_data(bias.into_data(), device) };
        let pre = h.clone() + bias.unsqueeze::<2>();
        let phi = match self.config.activation {
            Activation::None => pre,
            Activation::Relu => burn::tensor::activation::relu(pre),
            Activation::Tanh => pre.tanh(),
        };
        DocForward { phi, bag: h, uniq, entries }
    }

    /// Forward pass for training: features with their autodiff graph. Input dropout (if
    /// configured) draws from `rng`.
    pub fn forward(&self, docs: &[(&[u32], &[f32])], rng: &mut farout_core::Rng) -> DocForward {
        let p = self.config.dropout;
        if p == 0.0 {
            return self.forward_on(docs, &crate::autodiff_device(), true);
        }
        use farout_core::rng::RngExt;
        let keep = 1.0 / (1.0 - p);
        let kept: Vec<(Vec<u32>, Vec<f32>)> = docs
            .iter()
            .map(|(c, v)| c.iter().zip(*v).filter(|_| rng.random::<f32>() >= p).map(|(c, v)| (*c, v * keep)).unzip())
            .collect();
        let views: Vec<(&[u32], &[f32])> = kept.iter().map(|(c, v)| (c.as_slice(), v.as_slice())).collect();
        self.forward_on(&views, &crate::autodiff_device(), true)
    }

    /// Features of documents without gradient tracking (evaluation, prediction).
    pub fn encode(&self, docs: &[(&[u32], &[f32])]) -> Matrix {
        bridge::to_matrix(self.forward_on(docs, &crate::device(), false).phi)
    }

    /// Backward pass with upstream gradient `dphi` (`[batch, d_model]`): updates the table rows
    /// the batch used and the bias.
    pub fn backward(&mut self, fwd: DocForward, dphi: &Matrix) {
        let grads = self.gradients(fwd, dphi);
        self.apply(&grads);
    }

    /// The gradients of a batch's loss with upstream gradient `dphi` (`[batch, d_model]`),
    /// without updating anything: for data-parallel training, where the ranks sum their
    /// batches' gradients ([`DocGrads::add`]) before each applies the total.
    pub fn gradients(&self, fwd: DocForward, dphi: &Matrix) -> DocGrads {
        let d = self.d_model();
        let mut grads = bridge::backward_with_upstream(fwd.phi, dphi);
        let mut rows = Matrix::zeros(fwd.uniq.len(), d);
        if let Some(g) = fwd.bag.grad(&grads) {
            // dL/dE_f = sum over the batch's entries at f of x dL/dbag_doc.
            let g = bridge::to_matrix(g);
            for e in &fwd.entries {
                farout_core::kernels::axpy(e.x, g.row(e.doc as usize), rows.row_mut(e.at as usize));
            }
        }
        let mut gp = GradientsParams::from_module(&mut grads, self.hidden());
        let bias = match gp.remove::<1>(self.hidden().bias.id) {
            Some(t) => t.into_data().try_to_vec::<f32>().expect("farout tensors are f32"),
            None => vec![0.0; d],
        };
        DocGrads { features: fwd.uniq, rows, bias }
    }

    /// One optimiser step with `grads` (of this encoder's shapes): the rows of the table it
    /// names and the bias.
    pub fn apply(&mut self, grads: &DocGrads) {
        let d = self.d_model();
        assert_eq!((grads.rows.cols(), grads.bias.len()), (d, d), "gradients of another encoder");
        self.table_opt.apply_rows(&mut self.table, &grads.features, &grads.rows);
        let hidden = self.hidden.take().expect("hidden module is present between steps");
        let mut gp = GradientsParams::new();
        gp.register(hidden.bias.id, Tensor::<1>::from_data(TensorData::new(grads.bias.clone(), [d]), &crate::device()));
        let lr = self.table_opt.lr() as f64;
        self.hidden = Some(self.hidden_opt.step(lr, hidden, gp));
        self.table_opt.advance();
    }

    /// Saves the encoder into `dir` (`table.bin`, `hidden.bpk`, `hidden-optim.bpk`).
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let werr =
            |path: &Path, e: &dyn std::fmt::Display| Error::Weights { path: path.to_path_buf(), msg: e.to_string() };
        let p = dir.join("table.bin");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p).map_err(|e| werr(&p, &e))?);
        let io = |f: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
            write_u64(f, self.table.rows() as u64)?;
            write_u64(f, self.table.cols() as u64)?;
            write_u64(f, self.table_opt.step())?;
            write_f32s(f, self.table.as_slice())?;
            write_f32s(f, self.table_opt.accum())?;
            std::io::Write::flush(f)
        };
        io(&mut f).map_err(|e| werr(&p, &e))?;
        let hp = dir.join("hidden.bpk");
        self.hidden().clone().save_file(&hp).map_err(|e| werr(&hp, &e))?;
        let op = dir.join("hidden-optim.bpk");
        self.hidden_opt.save(&op).map_err(|e| werr(&op, &e))
    }

    /// Restores an encoder saved by [`Self::save`] into this one (same shapes and optimiser).
    pub fn load(&mut self, dir: &Path) -> Result<(), Error> {
        let werr =
            |path: &Path, e: &dyn std::fmt::Display| Error::Weights { path: path.to_path_buf(), msg: e.to_string() };
        let p = dir.join("table.bin");
        let mut f = std::io::BufReader::new(std::fs::File::open(&p).map_err(|e| werr(&p, &e))?);
        let (rows, cols) = (read_u64(&mut f).map_err(|e| werr(&p, &e))?, read_u64(&mut f).map_err(|e| werr(&p, &e))?);
        if (rows as usize, cols as usize) != (self.table.rows(), self.table.cols()) {
            return Err(werr(
                &p,
                &format!(
                    "table is {rows} x {cols} but the config builds {} x {}",
                    self.table.rows(),
                    self.table.cols()
                ),
            ));
        }
        let step = read_u64(&mut f).map_err(|e| werr(&p, &e))?;
        read_f32s(&mut f, self.table.as_mut_slice()).map_err(|e| werr(&p, &e))?;
        read_f32s(&mut f, self.table_opt.accum_mut()).map_err(|e| werr(&p, &e))?;
        self.table_opt.set_step(step);
        let hp = dir.join("hidden.bpk");
        let hidden = self.hidden.take().expect("hidden module is present between steps");
        self.hidden = Some(hidden.try_load_file(&hp).map_err(|e| werr(&hp, &e))?);
        let op = dir.join("hidden-optim.bpk");
        let opt = std::mem::replace(&mut self.hidden_opt, SgdConfig::new().init());
        self.hidden_opt = opt.load(&op).map_err(|e| werr(&op, &e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs() -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
        (vec![vec![0, 3], vec![3], vec![], vec![1, 2, 4]], vec![vec![0.6, 0.8], vec![1.0], vec![], vec![0.5, 0.5, 0.7]])
    }

    /// Reference forward on the host: act(sum_f x_f E_f + b).
    fn host_forward(enc: &DocEncoder, cols: &[u32], vals: &[f32]) -> Vec<f32> {
        let mut h = enc.hidden_bias();
        for (c, v) in cols.iter().zip(vals) {
            farout_core::kernels::axpy(*v, enc.table.row(*c as usize), &mut h);
        }
        h.iter()
            .map(|x| match enc.config.activation {
                Activation::None => *x,
                Activation::Relu => x.max(0.0),
                Activation::Tanh => x.tanh(),
            })
            .collect()
    }

    #[test]
    fn forward_matches_host_reference() {
        for act in [Activation::None, Activation::Relu, Activation::Tanh] {
            let enc =
                DocEncoder::new(&DocEncoderConfig { d_model: 4, activation: act, ..Default::default() }, 5, 1).unwrap();
            let (c, v) = docs();
            let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
            let phi = enc.encode(&batch);
            for (i, (cc, vv)) in c.iter().zip(&v).enumerate() {
                for (a, b) in phi.row(i).iter().zip(host_forward(&enc, cc, vv)) {
                    assert!((a - b).abs() < 1e-6, "{act:?}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn backward_updates_used_rows_by_the_chain_rule() {
        // Linear encoder, SGD lr 0.5: E_f <- E_f - 0.5 * sum_i x_if dphi_i, unused rows unchanged.
        let cfg = DocEncoderConfig {
            d_model: 3,
            optimizer: OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.0 },
            ..Default::default()
        };
        let mut enc = DocEncoder::new(&cfg, 6, 2).unwrap();
        let before = enc.table.clone();
        let (c, v) = docs();
        let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let dphi = Matrix::from_vec(4, 3, (0..12).map(|i| i as f32 * 0.1 - 0.5).collect()).unwrap();
        let fwd = enc.forward(&batch, &mut rng::seeded(0, 0));
        enc.backward(fwd, &dphi);
        for f in 0..6u32 {
            let mut expect = before.row(f as usize).to_vec();
            for (i, (cc, vv)) in c.iter().zip(&v).enumerate() {
                for (cf, x) in cc.iter().zip(vv) {
                    if *cf == f {
                        farout_core::kernels::axpy(-0.5 * x, dphi.row(i), &mut expect);
                    }
                }
            }
            for (a, b) in enc.table.row(f as usize).iter().zip(&expect) {
                assert!((a - b).abs() < 1e-5, "row {f}: {a} vs {b}");
            }
        }
        // Bias: b <- b - 0.5 * sum_i dphi_i
        let b = bridge::to_matrix(enc.hidden().bias.val().unsqueeze::<2>()).into_vec();
        for (j, bj) in b.iter().enumerate().take(3) {
            let s: f32 = (0..4).map(|i| dphi.row(i)[j]).sum();
            assert!((bj + 0.5 * s).abs() < 1e-5);
        }
    }

    /// The gradients of two halves of a batch, summed, step the encoder as the whole batch does
    /// (data parallelism over ranks), with AdaGrad and a nonlinearity.
    #[test]
    fn summed_gradients_of_parts_step_like_the_whole_batch() {
        let cfg = DocEncoderConfig {
            d_model: 3,
            activation: Activation::Tanh,
            optimizer: OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 },
            ..Default::default()
        };
        let (mut whole, mut parts) = (DocEncoder::new(&cfg, 6, 4).unwrap(), DocEncoder::new(&cfg, 6, 4).unwrap());
        let (c, v) = docs();
        let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let dphi = Matrix::from_vec(4, 3, (0..12).map(|i| i as f32 * 0.1 - 0.5).collect()).unwrap();
        for _ in 0..3 {
            whole.backward(whole.forward(&batch, &mut rng::seeded(0, 0)), &dphi);
            let halves: Vec<DocGrads> = [0..2, 2..4]
                .into_iter()
                .map(|r| {
                    let rows = Matrix::from_vec(2, 3, dphi.as_slice()[r.start * 3..r.end * 3].to_vec()).unwrap();
                    parts.gradients(parts.forward(&batch[r], &mut rng::seeded(0, 0)), &rows)
                })
                .collect();
            parts.apply(&DocGrads::add(&halves));
            let (a, b) = (whole.encode(&batch), parts.encode(&batch));
            for (x, y) in a.as_slice().iter().zip(b.as_slice()) {
                assert!((x - y).abs() < 1e-6, "{x} vs {y}");
            }
            assert_eq!(whole.table_opt.step(), parts.table_opt.step());
        }
        assert_ne!(whole.encode(&batch), DocEncoder::new(&cfg, 6, 4).unwrap().encode(&batch), "the steps move it");
    }

    #[test]
    fn save_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DocEncoderConfig { d_model: 3, ..Default::default() };
        let mut a = DocEncoder::new(&cfg, 6, 2).unwrap();
        let (c, v) = docs();
        let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let fwd = a.forward(&batch, &mut rng::seeded(0, 0));
        a.backward(fwd, &Matrix::from_vec(4, 3, vec![0.3; 12]).unwrap());
        a.save(dir.path()).unwrap();
        let mut b = DocEncoder::new(&cfg, 6, 99).unwrap();
        b.load(dir.path()).unwrap();
        assert_eq!(a.encode(&batch), b.encode(&batch));
        assert_eq!(a.table_opt, b.table_opt);
    }
}
