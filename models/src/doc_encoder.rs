use crate::{Error, bridge};
use burn::module::{Module, Param};
use burn::optim::{AdaGradConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::prelude::*;
use farout_core::binio::{read_f32s, read_u64, write_f32s, write_u64};
use farout_core::{Matrix, ParamError, rng};
use farout_dist::Strided;
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
    /// the same step as one process; nothing of the encoder crosses the ranks. A bag of words
    /// costs about one multiply-add per value of the gradient rows that data parallelism would
    /// move, so moving them costs more than computing them twice.
    Replicated,
    /// Feature-sharded, the default: the input table is dealt over the ranks like the output
    /// layer's classes (feature `f` lives on rank `f mod P`, a [`Strided`] deal). Each rank sums
    /// the rows it holds into every document's bag, the ranks sum the bags (`B x D` values),
    /// and each rank updates its own rows from the summed `dL/dphi`. The table's work and
    /// memory are split and only the bags cross the ranks.
    #[default]
    Features,
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
            ranks: EncoderRanks::Features,
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

/// The id of the hidden bias among Burn's parameters.
const HIDDEN_BIAS_ID: u64 = 0xB1A5;

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
    /// The features whose rows `table` holds, of the whole vocabulary (`deal.rows()`).
    deal: Strided,
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
    /// The rows of the table the batch uses, ascending.
    uniq: Vec<u32>,
    /// Every (document, feature, value) of the batch.
    entries: Vec<BagEntry>,
}

/// The gradients of a batch's loss with respect to the encoder ([`DocEncoder::gradients`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DocGrads {
    /// The table rows the batch used, ascending (the features themselves unless the table is
    /// dealt over ranks, [`DocEncoder::dealt`]).
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
        Self::dealt(config, seed, Strided::whole(n_features))
    }

    /// The part `deal` (of a vocabulary of `deal.rows()` features) of the encoder [`Self::new`] builds: the same bias, and the input-table
    /// rows (with their optimiser state) of `deal`'s features alone, the values the whole
    /// table has there. A rank's part of a feature-sharded encoder ([`EncoderRanks::Features`]):
    /// its forward passes give partial bags for the caller to sum over the parts
    /// ([`Self::forward_summed`]).
    pub fn dealt(config: &DocEncoderConfig, seed: u64, deal: Strided) -> Result<Self, Error> {
        config.check()?;
        let d = config.d_model;
        let mut table = Matrix::zeros(deal.len(), d);
        // The whole table's values drawn in order, this part's rows kept.
        let mut r = rng::seeded(seed, 0x7AB1E);
        let mut rows = table.as_mut_slice().chunks_exact_mut(d.max(1));
        for f in 0..deal.rows() {
            let mut row = deal.local(f).map(|_| rows.next().expect("a row per held feature"));
            for j in 0..d {
                let x = config.init_std * rng::normal(&mut r);
                if let Some(row) = row.as_mut() {
                    row[j] = x;
                }
            }
        }
        let mut bias = Param::from_tensor(Tensor::zeros([d], &crate::autodiff_device()));
        // A fixed id instead of a random one: the saved bias and its optimiser state are then
        // the same file on every rank of a run, as `farout reshard` checks.
        bias.id = burn::module::ParamId::from(HIDDEN_BIAS_ID);
        let hidden = Hidden { bias };
        let hidden_opt = match config.optimizer {
            OptimizerConfig::Sgd { .. } => SgdConfig::new().init(),
            OptimizerConfig::Adagrad { eps, .. } => AdaGradConfig::new().with_epsilon(eps).init(),
            OptimizerConfig::ArSchedule { .. } => unreachable!("DocEncoderConfig::check rejects ar_schedule"),
        };
        Ok(Self {
            config: config.clone(),
            deal,
            table_opt: config.optimizer.build(table.rows(), d),
            table,
            hidden: Some(hidden),
            hidden_opt,
        })
    }

    /// Features of the whole vocabulary.
    pub fn n_features(&self) -> usize {
        self.deal.rows()
    }

    /// The features whose input-table rows this encoder holds.
    pub fn deal(&self) -> Strided {
        self.deal
    }

    /// Output dimension D.
    pub fn d_model(&self) -> usize {
        self.config.d_model
    }

    /// The input table (vocabulary x D), or the rows of its deal's features.
    pub fn table(&self) -> &Matrix {
        &self.table
    }

    /// The optimiser state of [`Self::table`] (AdaGrad's sums, row-major; empty for SGD).
    pub fn table_state(&self) -> &[f32] {
        self.table_opt.accum()
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

    /// Forward pass of a batch of documents (each `(feature ids, values)`) on `device`, the
    /// bags of the table's rows summed over the deal's parts by `sum` (see
    /// [`Self::forward_summed`]).
    fn forward_on<E>(
        &self,
        docs: &[(&[u32], &[f32])],
        device: &Device,
        track: bool,
        sum: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<DocForward, E> {
        let d = self.d_model();
        // The bag `sum_f x_f E_f` of every document, here: its gradient with respect to `E` is
        // sparse, and scattering it row by row beats Burn's gather and scatter-add. A dealt
        // table sums the words of its features only.
        let deal = self.deal;
        let held = || {
            docs.iter()
                .map(|(c, v)| c.iter().zip(*v).filter_map(move |(&f, &x)| Some((deal.local(f as usize)? as u32, x))))
        };
        let mut uniq: Vec<u32> = held().flatten().map(|(r, _)| r).collect();
        uniq.sort_unstable();
        uniq.dedup();
        let mut bag = Matrix::zeros(docs.len(), d);
        let mut entries = Vec::with_capacity(docs.iter().map(|(c, _)| c.len()).sum());
        // The table rows are scattered over a large table: each is requested a few words ahead,
        // so that their loads overlap instead of waiting one by one.
        let mut ahead = held().flatten().skip(BAG_AHEAD);
        for (i, words) in held().enumerate() {
            for (r, x) in words {
                if let Some((next, _)) = ahead.next() {
                    farout_core::kernels::prefetch(self.table.row(next as usize));
                }
                farout_core::kernels::axpy(x, self.table.row(r as usize), bag.row_mut(i));
                let at = uniq.binary_search(&r).expect("every row is in uniq") as u32;
                entries.push(BagEntry { doc: i as u32, at, x });
            }
        }
        sum(bag.as_mut_slice())?;
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
        Ok(DocForward { phi, bag: h, uniq, entries })
    }

    /// Forward pass for training: features with their autodiff graph. Input dropout (if
    /// configured) draws from `rng`.
    pub fn forward(&self, docs: &[(&[u32], &[f32])], rng: &mut farout_core::Rng) -> DocForward {
        assert_eq!(self.deal.ranks(), 1, "a dealt encoder's bags are summed over its parts: forward_summed");
        whole(self.forward_summed(docs, rng, whole_bags))
    }

    /// [`Self::forward`] of a dealt encoder ([`Self::dealt`]): `sum` replaces the partial bags
    /// `sum_f x_f E_f` over this part's features (`[batch, d_model]`, row-major) by their sum
    /// over all the parts before the bias and the nonlinearity. Every part draws the same
    /// dropout from the same `rng`.
    pub fn forward_summed<E>(
        &self,
        docs: &[(&[u32], &[f32])],
        rng: &mut farout_core::Rng,
        sum: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<DocForward, E> {
        let p = self.config.dropout;
        if p == 0.0 {
            return self.forward_on(docs, &crate::autodiff_device(), true, sum);
        }
        use farout_core::rng::RngExt;
        let keep = 1.0 / (1.0 - p);
        let kept: Vec<(Vec<u32>, Vec<f32>)> = docs
            .iter()
            .map(|(c, v)| c.iter().zip(*v).filter(|_| rng.random::<f32>() >= p).map(|(c, v)| (*c, v * keep)).unzip())
            .collect();
        let views: Vec<(&[u32], &[f32])> = kept.iter().map(|(c, v)| (c.as_slice(), v.as_slice())).collect();
        self.forward_on(&views, &crate::autodiff_device(), true, sum)
    }

    /// Features of documents without gradient tracking (evaluation, prediction).
    pub fn encode(&self, docs: &[(&[u32], &[f32])]) -> Matrix {
        assert_eq!(self.deal.ranks(), 1, "a dealt encoder's bags are summed over its parts: encode_summed");
        whole(self.encode_summed(docs, whole_bags))
    }

    /// [`Self::encode`] of a dealt encoder, the partial bags summed by `sum` as in
    /// [`Self::forward_summed`].
    pub fn encode_summed<E>(
        &self,
        docs: &[(&[u32], &[f32])],
        sum: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<Matrix, E> {
        Ok(bridge::to_matrix(self.forward_on(docs, &crate::device(), false, sum)?.phi))
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
        assert_eq!(self.deal.ranks(), 1, "a dealt encoder saves the joined table: save_joined");
        self.save_joined(dir, self.table.as_slice(), self.table_opt.accum())
    }

    /// [`Self::save`] of a dealt encoder: `table` and `state` are the whole vocabulary's rows
    /// and optimiser state in feature order, every part's joined by the caller
    /// ([`join_dealt`]), so that the file is the one a single process writes.
    pub fn save_joined(&self, dir: &Path, table: &[f32], state: &[f32]) -> Result<(), Error> {
        let d = self.d_model();
        assert!(table.len() == self.n_features() * d && state.len() == table.len() * usize::from(!state.is_empty()));
        let werr =
            |path: &Path, e: &dyn std::fmt::Display| Error::Weights { path: path.to_path_buf(), msg: e.to_string() };
        let p = dir.join("table.bin");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p).map_err(|e| werr(&p, &e))?);
        let io = |f: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
            write_u64(f, self.n_features() as u64)?;
            write_u64(f, d as u64)?;
            write_u64(f, self.table_opt.step())?;
            write_f32s(f, table)?;
            write_f32s(f, state)?;
            std::io::Write::flush(f)
        };
        io(&mut f).map_err(|e| werr(&p, &e))?;
        let hp = dir.join("hidden.bpk");
        self.hidden().clone().save_file(&hp).map_err(|e| werr(&hp, &e))?;
        let op = dir.join("hidden-optim.bpk");
        self.hidden_opt.save(&op).map_err(|e| werr(&op, &e))
    }

    /// Restores an encoder saved by [`Self::save`] into this one (same shapes and optimiser);
    /// a dealt encoder keeps its features' rows of the saved table.
    pub fn load(&mut self, dir: &Path) -> Result<(), Error> {
        let werr =
            |path: &Path, e: &dyn std::fmt::Display| Error::Weights { path: path.to_path_buf(), msg: e.to_string() };
        let p = dir.join("table.bin");
        let mut f = std::io::BufReader::new(std::fs::File::open(&p).map_err(|e| werr(&p, &e))?);
        let (rows, cols) = (read_u64(&mut f).map_err(|e| werr(&p, &e))?, read_u64(&mut f).map_err(|e| werr(&p, &e))?);
        let d = self.d_model();
        let n = self.n_features();
        if (rows as usize, cols as usize) != (n, d) {
            return Err(werr(&p, &format!("table is {rows} x {cols} but the config builds {n} x {d}")));
        }
        let step = read_u64(&mut f).map_err(|e| werr(&p, &e))?;
        if self.deal.ranks() == 1 {
            read_f32s(&mut f, self.table.as_mut_slice()).map_err(|e| werr(&p, &e))?;
            read_f32s(&mut f, self.table_opt.accum_mut()).map_err(|e| werr(&p, &e))?;
        } else {
            let mut table = vec![0.0; n * d];
            let mut state = vec![0.0; if self.table_opt.is_adaptive() { n * d } else { 0 }];
            read_f32s(&mut f, &mut table).map_err(|e| werr(&p, &e))?;
            read_f32s(&mut f, &mut state).map_err(|e| werr(&p, &e))?;
            let (rows, state) = keep_dealt(self.deal, &table, &state, d);
            self.table = rows;
            self.table_opt.accum_mut().copy_from_slice(&state);
        }
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

/// The rows of `deal`'s features of a whole vocabulary's `table` (`d` columns) and of its
/// optimiser `state` (empty for SGD).
fn keep_dealt(deal: Strided, table: &[f32], state: &[f32], d: usize) -> (Matrix, Vec<f32>) {
    let pick = |all: &[f32]| -> Vec<f32> {
        if all.is_empty() {
            return Vec::new();
        }
        (0..deal.len()).flat_map(|r| &all[deal.global(r) * d..(deal.global(r) + 1) * d]).copied().collect()
    };
    (Matrix::from_vec(deal.len(), d, pick(table)).expect("rows of d"), pick(state))
}

/// The whole vocabulary's rows (`n_features x d`, in feature order) from every part's rows of
/// a table dealt over `ranks` parts ([`Strided`]), given part after part (`parts`: what an
/// allgather of the parts' [`DocEncoder::table`] or [`DocEncoder::table_state`] gives).
pub fn join_dealt(parts: &[f32], ranks: usize, n_features: usize, d: usize) -> Vec<f32> {
    assert_eq!(parts.len(), n_features * d, "every part's rows");
    Strided::joined_positions(n_features, ranks)
        .into_iter()
        .flat_map(|at| &parts[at * d..(at + 1) * d])
        .copied()
        .collect()
}

/// The sum over parts of an encoder that is not dealt: its bags are whole already.
fn whole_bags(_: &mut [f32]) -> Result<(), std::convert::Infallible> {
    Ok(())
}

fn whole<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(never) => match never {},
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

    /// The partial bags of every part of a dealt encoder, summed: what the ranks' allreduce
    /// gives each of them in a training step whose dropout draws from `seeded(step, 0)`, or
    /// without dropout.
    fn summed_bags(parts: &[DocEncoder], batch: &[(&[u32], &[f32])], step: Option<u64>) -> Vec<f32> {
        let mut total = vec![0.0; batch.len() * parts[0].d_model()];
        for part in parts {
            let add = |b: &mut [f32]| {
                total.iter_mut().zip(b.iter()).for_each(|(t, x)| *t += x);
                Ok::<(), ()>(())
            };
            match step {
                Some(step) => drop(part.forward_summed(batch, &mut rng::seeded(step, 0), add).unwrap()),
                None => drop(part.encode_summed(batch, add).unwrap()),
            }
        }
        total
    }

    /// An encoder dealt over 2 and 3 parts, its bags summed over them, encodes and steps as the
    /// whole one (with AdaGrad, a nonlinearity and input dropout drawn alike by every part):
    /// each part's rows stay the whole table's rows of its features, and its step counter and
    /// bias the whole one's.
    #[test]
    fn dealt_parts_with_summed_bags_step_like_the_whole_encoder() {
        let cfg = DocEncoderConfig {
            d_model: 3,
            activation: Activation::Tanh,
            dropout: 0.25,
            optimizer: OptimizerConfig::Adagrad { lr: 0.3, eps: 1e-8, l2: 0.0 },
            ..Default::default()
        };
        let (c, v) = docs();
        let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let dphi = Matrix::from_vec(4, 3, (0..12).map(|i| i as f32 * 0.1 - 0.5).collect()).unwrap();
        for ranks in [2, 3] {
            let mut whole = DocEncoder::new(&cfg, 7, 4).unwrap();
            let deal = |rank| Strided::new(7, rank, ranks).unwrap();
            let mut parts: Vec<DocEncoder> = (0..ranks).map(|r| DocEncoder::dealt(&cfg, 4, deal(r)).unwrap()).collect();
            for step in 0..3 {
                whole.backward(whole.forward(&batch, &mut rng::seeded(step, 0)), &dphi);
                let total = summed_bags(&parts, &batch, Some(step));
                for part in &mut parts {
                    let sum = |b: &mut [f32]| {
                        b.copy_from_slice(&total);
                        Ok::<(), ()>(())
                    };
                    let fwd = part.forward_summed(&batch, &mut rng::seeded(step, 0), sum).unwrap();
                    part.backward(fwd, &dphi);
                }
                for (r, part) in parts.iter().enumerate() {
                    assert_eq!(part.table.rows(), deal(r).len());
                    for row in 0..part.table.rows() {
                        let f = deal(r).global(row);
                        for (a, b) in part.table.row(row).iter().zip(whole.table.row(f)) {
                            assert!((a - b).abs() < 1e-6, "{ranks} parts, step {step}, feature {f}: {a} vs {b}");
                        }
                    }
                    assert_eq!(part.table_opt.step(), whole.table_opt.step());
                    assert_eq!(part.hidden_bias(), whole.hidden_bias());
                }
            }
            let total = summed_bags(&parts, &batch, None);
            let phi = parts[0]
                .encode_summed(&batch, |b| {
                    b.copy_from_slice(&total);
                    Ok::<(), ()>(())
                })
                .unwrap();
            for (a, b) in phi.as_slice().iter().zip(whole.encode(&batch).as_slice()) {
                assert!((a - b).abs() < 1e-6, "{ranks} parts: {a} vs {b}");
            }
        }
    }

    /// The parts of a dealt encoder save, from their joined rows, the file the whole encoder
    /// saves, and load their own rows of it.
    #[test]
    fn dealt_parts_save_the_whole_table_and_load_their_rows() {
        let cfg = DocEncoderConfig { d_model: 3, ..Default::default() };
        let (c, v) = docs();
        let batch: Vec<(&[u32], &[f32])> = c.iter().zip(&v).map(|(a, b)| (a.as_slice(), b.as_slice())).collect();
        let dphi = Matrix::from_vec(4, 3, vec![0.3; 12]).unwrap();
        let mut whole = DocEncoder::new(&cfg, 5, 2).unwrap();
        whole.backward(whole.forward(&batch, &mut rng::seeded(0, 0)), &dphi);
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        whole.save(a.path()).unwrap();
        let parts: Vec<DocEncoder> = (0..2)
            .map(|rank| {
                let mut part = DocEncoder::dealt(&cfg, 99, Strided::new(5, rank, 2).unwrap()).unwrap();
                part.load(a.path()).unwrap();
                part
            })
            .collect();
        let joined = |f: fn(&DocEncoder) -> Vec<f32>| join_dealt(&[f(&parts[0]), f(&parts[1])].concat(), 2, 5, 3);
        let (table, state) = (joined(|p| p.table.as_slice().to_vec()), joined(|p| p.table_state().to_vec()));
        assert_eq!((table.as_slice(), state.as_slice()), (whole.table.as_slice(), whole.table_state()));
        parts[1].save_joined(b.path(), &table, &state).unwrap();
        let file = |d: &tempfile::TempDir| std::fs::read(d.path().join("table.bin")).unwrap();
        assert!(file(&a) == file(&b), "the joined table's file is the whole encoder's");
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
