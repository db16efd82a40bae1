//! PPDSparse: every label's elastic-net squared-hinge problem solved in the dual by a greedy
//! active-set method (Yen et al., KDD'17, \[P\]), in parallel over labels, then pruned.
//!
//! # The problem of one label
//!
//! With y_i = +1 on the label's positives and −1 elsewhere, x_i carrying the implicit bias
//! feature x_{i,0} = 1 (stored as the *last* weight coordinate, index d, like everywhere in this
//! crate), and the squared hinge of \[P\] Sect. 5.2:
//!
//! ```text
//! F(w) = λ Σ_{j≠0} |w_j| + (τ/2)‖w‖² + Σ_i ½ max(1 − y_i wᵀx_i, 0)²          (eq. 9, Sect. 5.2)
//! ```
//!
//! The bias is not ℓ1-penalised (\[P\] after eq. 10) but is ℓ2-regularised. τ multiplies the
//! whole ℓ2 term (\[P\] Sect. 5.2 names τ without its form; project choice). The Fenchel dual
//! (eq. 10 with the squared hinge's conjugate `ℓ*(−a) = −a + a²/2`, a ≥ 0, as in Hsieh et al.
//! 2008, \[P\]'s ref. 13) is
//!
//! ```text
//! G(α) = (τ/2)‖w(α)‖² + ½‖α‖² − Σ_i α_i,   α ≥ 0 (U = ∞),
//! w(α) = prox_λ(v)/τ,   v = X̂ᵀα = Σ_i α_i y_i x_i,                                 (eq. 10, 13)
//! prox_λ(v)_j = sign(v_j) max(|v_j| − λ, 0) for j ≠ 0,   prox_λ(v)_0 = v_0,
//! ∇_i G = y_i w(α)ᵀx_i + α_i − 1,                                                 (eq. 12)
//! H_ii  = (‖x_i‖² + 1)/τ + 1    (the +1 inside is the bias feature)
//! ```
//!
//! and `F(w(α*)) = −G(α*)`, so `F(w(α)) + G(α) ≥ 0` is the duality gap reported per label.
//! Since `(τ/2)‖w‖² + Σ ½φ = τ·(½‖w‖² + (1/(2τ)) Σ φ)`, λ = 0 gives DiSMEC's minimiser with
//! C = 1/(2τ) (C = ½ at τ = 1); H_ii bounds the curvature of G along α_i (soft-thresholding
//! only lowers it), so each coordinate step below decreases G.
//!
//! # The algorithm (\[P\] Algorithms 1–3)
//!
//! ```text
//! α = 0, v = w = 0, A = P                                   (Alg. 1 step 0)
//! for t = 1..=max_iter:
//!   Alg. 2: S ≤ inner_sweeps·|A| steps, in sweeps over A in a fresh random order each (done
//!           early after a sweep whose projected gradients are all ≤ tol):
//!           α_i ← max(α_i − ∇_iG/H_ii, 0); v += Δα_i y_i x_i; w_j ← prox(v_j)/τ on x_i's features
//!   Alg. 1 step 4: drop i ∈ A with α_i = 0 and y_i = −1 (positives stay)
//!   PG = max_{i∈A} |projected ∇_iG|
//!   search (Alg. 1 steps 1–2): z_i = Σ_j w̃_j x_ij by walking the CSC columns of the j with
//!           w̃_j ≠ 0 (eq. 14), the bias w_0 added as a scalar; candidates i ∉ A by −∇_iG = 1 − y_i z_i
//!   w̃ = RandomSparsify(w) (Alg. 3, R = ⌈2‖w‖₁²/δ²⌉, Thm 4.1) when R < nnz(w), else
//!   w̃ = Truncate(w, δ/2) when that halves the walk, else w̃ = w;
//!   candidates of an approximate search are kept only if their exact −∇_iG > tol (O(d̄) each);
//!   if none is left and PG ≤ tol, search again with w̃ = w
//!   exact search, no candidate with −∇_iG > tol, and PG ≤ tol: stop
//!   A ∪= the κ candidates with the largest −∇_iG > tol, κ = max(|A|, min_kappa) by default
//! ```
//!
//! The exact search is certified instead of walked (project choice, below) when every x_ij ≥ 0,
//! every positive is in A and `1 + w_0 ≤ tol`: only the columns with w_j > 0 are walked, which
//! bounds every negative's margin from above, and only the rows that bound does not clear are
//! scored exactly. It proposes the same candidates as the walk of every column, and when it is
//! available it is the search of the iteration (no approximate search first).
//!
//! Truncate(w, β) (project choice, below) drops from w the columns j that cost the most walk
//! per unit of their bound |w_j|·max_i |x_ij|, while the dropped bounds sum to at most β, so every
//! z_i of the truncated search is within β of the exact one.
//!
//! At t = 1 every ∇_iG = −1 (all tied), so the first step 3 runs on A = P before any search
//! (a project choice). A row that shares no feature with w̃ has z_i = 0 and −∇_iG = 1 − y_i w_0: all
//! such negatives tie, and the search takes the lowest indices among them. With
//! `column_threshold` > 0, columns are stored sorted by |x_ij| descending, so the two-level
//! sparsification of \[P\] Sect. 5.3 stops a column's walk at the first |x_ij| <
//! `column_threshold` (approximate searches only; the exact search that decides convergence
//! walks every entry).
//!
//! # Project choices (\[P\] leaves them open)
//!
//! κ (`kappa`; 0 = max(|A|, `min_kappa`), so the active set can at most double per iteration
//! once it holds `min_kappa` samples), T (`max_iter`),
//! S (at most `inner_sweeps`·|A| uniform draws, fewer once a sweep's drawn projected gradients
//! are all ≤ `tol`), δ (`delta`, 0 = always exact), the Sect. 5.3 threshold,
//! the stopping rule and its `tol` (which also bounds what the search adds: only −∇_iG > tol),
//! U = ∞ (squared hinge), Alg. 1's undefined "b = 1" is ignored. Weights with |w| below
//! `prune_threshold` are then set to zero exactly like DiSMEC's ([`crate::dismec::prune`]; the
//! bias is not exempt).
//!
//! Five of them were set by measurement on a synthetic tagging set, where every search walks
//! the long columns of the commonest features (see docs/decisions.md, "ppdsparse-min-kappa",
//! "ppdsparse-sweep-order", "ppdsparse-tol", "ppdsparse-truncated-search" and
//! "ppdsparse-certified-search"), and λ on four sets ("ppdsparse-lambda"):
//!
//! - **`min_kappa` = 256.** With κ = |A| alone, a label with a handful of positives starts from
//!   a tiny A and needs about ten doublings to reach its support vectors, each paying a search.
//! - **Sweeps in random order.** \[P\]'s Alg. 2 draws each step's i uniformly from A, so a sweep
//!   of |A| draws misses about a third of A; a fresh permutation of A per sweep (as LIBLINEAR
//!   orders its steps) visits every i once.
//! - **`tol` = 0.1**, the default stopping tolerance of LIBLINEAR's dual coordinate descent for
//!   the same squared-hinge dual and of omikuji's per-node solver.
//! - **The certified exact search** ([`Label::certified_search`]). Outside A every row is a
//!   negative with `−∇_iG = 1 + w_0 + wᵀx_i`; with x ≥ 0, `wᵀx_i ≤ Σ_{w_j > 0} w_j x_ij`, so
//!   walking the columns with w_j > 0 and checking exactly the rows whose bound exceeds `tol`
//!   finds every violator. The long columns of frequent features, most of a full walk, mostly
//!   carry negative weights. The price: the final F is then bounded above (exact on A), so the
//!   reported duality gap is an upper bound (`primal_is_bound`).
//! - **The truncated search.** When R ≥ nnz(w), Alg. 3 cannot sparsify; dropping the columns
//!   whose bounds sum to at most δ/2 keeps every truncated z_i within δ/2 of the exact one (for
//!   sure, where Thm 4.1 gives Alg. 3's w̃ precision δ with high probability). Like Alg. 3's, its
//!   candidates are checked against the exact gradient, and only the exact search decides
//!   convergence.
//! - **λ = 0.03**, where \[P\] Sect. 6 found 0.01 best on most of its sets: on Bibtex, Delicious
//!   and two synthetic tagging sets the P@k stay within a quarter of a point, while the sparser
//!   w makes the searches and the coordinate steps cheaper and the model predict faster.
//!
//! The defaults suit labels with tens of positives or more (Bibtex, Delicious). Where labels have
//! a handful of positives each, a weaker ℓ2 term ranks them higher: the synthetic tagging sets
//! reach one-vs-all's accuracy at C = 1 with τ = 0.2, λ = 0.05, `tol` = 0.2 and `min_kappa` =
//! 128 (`configs/xmc-synthetic-ppdsparse.toml`, docs/decisions.md, "ppdsparse-recipes").
//!
//! # Parallelism and determinism
//!
//! The CSC transpose of X, ‖x_i‖² and the column maxima are built once per fit and shared
//! read-only. Labels go to rayon largest |P| first; each worker keeps one scratch (dense f64
//! vectors of length n and d + 1) through `map_init`, reset after each label by walking only
//! what the label touched, so a label costs O(its work), not O(n + d). Each label draws from its
//! own generator `seeded(seed, label)`, so the model is bit-identical for any number of threads.
//!
//! Implementation choices that do not change any result bit (see docs/decisions.md,
//! "ppdsparse-implementation"): Alg. 2 reads only v (`w_j = prox(v_j)/τ` recomputed per entry,
//! w written back once per call), which halves its random memory traffic; a search whose walk
//! covers at least n entries scores every row without marking any; the top-κ selection keeps a
//! bounded buffer ([`TopK`]) instead of collecting and partially sorting all violators, which
//! early in a label are half of the n rows. Without `column_threshold`, columns are stored by
//! row, so that a walk's writes to the scores move forward through memory, and a walk marks the
//! rows it meets without branching on the mark.
//!
//! Parameters (`[linear] solver = "ppdsparse"`), with their defaults:
//!
//! ```toml
//! lambda = 0.03          # ℓ1 weight λ ([P] Sect. 6 used 0.01: see below)
//! tau = 1.0              # ℓ2 weight τ of (τ/2)‖w‖² ([P] Sect. 6)
//! kappa = 0              # candidates added per search (0: max(|A|, min_kappa))
//! min_kappa = 256        # with kappa = 0, the fewest candidates a search adds
//! max_iter = 100         # outer iterations T of Alg. 1
//! inner_sweeps = 3       # Alg. 2 sweeps over A per outer iteration, at most
//! delta = 1.0            # Alg. 3 precision δ, R = ceil(2‖w‖₁²/δ²) (0: exact search only)
//! column_threshold = 0.0 # [P] Sect. 5.3: skip |x_ij| below this in approximate searches
//! tol = 0.1              # stop: no violator −∇_iG > tol outside A, projected gradient ≤ tol on A
//! bias = true
//! prune_threshold = 0.01
//! seed = 0
//! ```

use crate::contract::{FitSummary, Fitted, LinearSolver, Progress, mean_and_q95};
use crate::data::{SparseRows, TrainSet};
use crate::model::SparseModel;
use crate::newton::Rows;
use crate::ova::{check_label_range, one_vs_all};
use crate::{Error, Result};
use farout_core::ParamError;
use farout_core::rng::{self, Rng, RngExt};
use farout_core::space::Dim;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::ops::Range;
use std::time::Instant;

/// PPDSparse parameters (see the module docs for the TOML form, defaults and project choices).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpdSparseConfig {
    /// ℓ1 weight λ of eq. 9 (not applied to the bias).
    pub lambda: f64,
    /// ℓ2 weight τ: the regulariser is `(τ/2)‖w‖²` (\[P\] Sect. 5.2).
    pub tau: f64,
    /// Candidates κ added to the active set per search (Alg. 1 step 2); 0 means
    /// max(|A|, `min_kappa`).
    pub kappa: usize,
    /// With `kappa` = 0, the fewest candidates a search adds (if that many violate).
    pub min_kappa: usize,
    /// Outer iterations T of Alg. 1 per label.
    pub max_iter: usize,
    /// Coordinate steps S of Alg. 2 per outer iteration, in multiples of |A|.
    pub inner_sweeps: usize,
    /// Precision δ of the sparsified search: Alg. 3 with `R = ⌈2‖w‖₁²/δ²⌉` (Thm 4.1) when that
    /// is below nnz(w); 0 always searches with w itself.
    pub delta: f64,
    /// \[P\] Sect. 5.3: approximate searches skip the entries with |x_ij| below this (0: none).
    pub column_threshold: f64,
    /// Stopping tolerance on −∇_iG outside A and on the projected gradient on A.
    pub tol: f64,
    /// Whether to add the constant feature x_0 = 1 (ℓ2- but not ℓ1-regularised).
    pub bias: bool,
    /// Weights with |w| below this are set to zero after training (as DiSMEC's).
    pub prune_threshold: f64,
    /// Seed of the per-label generators `seeded(seed, label)` (Alg. 2 draws, Alg. 3).
    pub seed: u64,
}

impl Default for PpdSparseConfig {
    fn default() -> Self {
        Self {
            lambda: 0.03,
            tau: 1.0,
            kappa: 0,
            min_kappa: 256,
            max_iter: 100,
            inner_sweeps: 3,
            delta: 1.0,
            column_threshold: 0.0,
            tol: 0.1,
            bias: true,
            prune_threshold: 0.01,
            seed: 0,
        }
    }
}

impl PpdSparseConfig {
    /// Checks every value; the error names the key (relative to `[linear]`) and what is allowed.
    pub fn check(&self) -> std::result::Result<(), ParamError> {
        if !(self.lambda >= 0.0 && self.lambda.is_finite()) {
            return Err(ParamError::new("lambda", self.lambda, "must be a finite number >= 0 (0.01, 0.1 or 1 in [P])"));
        }
        if !(self.tau > 0.0 && self.tau.is_finite()) {
            return Err(ParamError::new("tau", self.tau, "must be a finite number > 0 (0.1, 1 or 10 in [P])"));
        }
        if self.max_iter == 0 {
            return Err(ParamError::new("max_iter", self.max_iter, "must be an integer >= 1"));
        }
        if self.inner_sweeps == 0 {
            return Err(ParamError::new("inner_sweeps", self.inner_sweeps, "must be an integer >= 1"));
        }
        if !(self.delta >= 0.0 && self.delta.is_finite()) {
            return Err(ParamError::new("delta", self.delta, "must be a finite number >= 0 (0 searches exactly)"));
        }
        if !(self.column_threshold >= 0.0 && self.column_threshold.is_finite()) {
            return Err(ParamError::new(
                "column_threshold",
                self.column_threshold,
                "must be a finite number >= 0 (0 walks every entry)",
            ));
        }
        if !(self.tol > 0.0 && self.tol.is_finite()) {
            return Err(ParamError::new("tol", self.tol, "must be a finite number > 0"));
        }
        if !(self.prune_threshold >= 0.0 && self.prune_threshold.is_finite()) {
            return Err(ParamError::new(
                "prune_threshold",
                self.prune_threshold,
                "must be a finite number >= 0 (0 keeps every weight)",
            ));
        }
        Ok(())
    }

    /// Trains every label in parallel on the current rayon pool and prunes the weights,
    /// advancing `progress` by one per finished label.
    pub fn train(&self, data: &TrainSet, progress: &dyn Progress) -> Result<PpdTrained> {
        self.train_labels(data, 0..data.n_labels(), progress)
    }

    /// As [`PpdSparseConfig::train`] for the labels `labels` only (one rank's shard): the
    /// model's label `i` is label `labels.start + i`, identical to that label of the whole model
    /// (each label draws from its own generator).
    pub fn train_labels(&self, data: &TrainSet, labels: Range<usize>, progress: &dyn Progress) -> Result<PpdTrained> {
        self.check()?;
        check_label_range(&labels, data.n_labels())?;
        let start = Instant::now();
        let n = data.n_samples();
        check_size(n)?;
        let shared = Shared::new(&data.features, self.bias, self.column_threshold > 0.0);
        let (model, labels) = one_vs_all(
            data,
            labels,
            self.bias,
            progress,
            || Scratch::new(shared.n_vars(), n),
            |scratch, j| {
                let start = Instant::now();
                let mut st = solve_label(self, &shared, data.labels.positives(j), j, scratch);
                let (f, w, b) = scratch.pruned(&shared, self.prune_threshold);
                scratch.reset(&shared);
                st.nnz_after_pruning = f.len() + (b != 0.0) as usize;
                st.seconds = start.elapsed().as_secs_f64();
                (f, w, b, st)
            },
        )?;
        Ok(PpdTrained {
            nnz_before_pruning: labels.iter().map(|s| s.nnz_before_pruning).sum(),
            nnz_after_pruning: model.nnz(),
            model,
            labels,
            seconds: start.elapsed().as_secs_f64(),
            threads: rayon::current_num_threads(),
        })
    }

    /// Trains label `k` alone: its unpruned dense weights (bias last when `bias`) and stats.
    pub fn train_label(&self, data: &TrainSet, k: usize) -> Result<(Vec<f64>, PpdLabelStats)> {
        self.check()?;
        check_size(data.n_samples())?;
        if k >= data.n_labels() {
            return Err(Error::Shape { what: "label", detail: format!("label {k} of {}", data.n_labels()) });
        }
        let shared = Shared::new(&data.features, self.bias, self.column_threshold > 0.0);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let st = solve_label(self, &shared, data.labels.positives(k), k, &mut scratch);
        Ok((scratch.w.clone(), st))
    }
}

fn check_size(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::Shape { what: "training set", detail: "no samples".into() });
    }
    if n > u32::MAX as usize {
        return Err(Error::Shape { what: "training set", detail: format!("{n} samples: ids are 32-bit") });
    }
    Ok(())
}

impl LinearSolver for PpdSparseConfig {
    fn check(&self) -> std::result::Result<(), ParamError> {
        PpdSparseConfig::check(self)
    }

    /// λ (ℓ1) and τ (ℓ2) over the ranges \[P\] tries (0.01–1 and 0.1–10), log-uniformly, and
    /// the pruning threshold around 0.01.
    fn search_space(&self) -> Vec<Dim> {
        vec![
            Dim::float_log("lambda", 0.001, 1.0),
            Dim::float_log("tau", 0.1, 10.0),
            Dim::float_log("prune_threshold", 0.001, 0.1),
        ]
    }

    fn fit(&self, data: &TrainSet, progress: &dyn Progress) -> Result<Fitted> {
        self.fit_labels(data, 0..data.n_labels(), progress)
    }

    fn label_parallel(&self) -> bool {
        true
    }

    fn fit_labels(&self, data: &TrainSet, labels: Range<usize>, progress: &dyn Progress) -> Result<Fitted> {
        let t = self.train_labels(data, labels, progress)?;
        let l = &t.labels;
        let (outer_mean, outer_q95) = mean_and_q95(l.iter().map(|s| f64::from(s.outer_iters)));
        let (active_mean, active_q95) = mean_and_q95(l.iter().map(|s| s.active_size as f64));
        let (nnz_mean, nnz_q95) = mean_and_q95(l.iter().map(|s| s.nnz_before_pruning as f64));
        let sparsified: Vec<&PpdLabelStats> = l.iter().filter(|s| s.sparsified_searches > 0).collect();
        let (wtilde_mean, wtilde_q95) = mean_and_q95(sparsified.iter().map(|s| s.mean_nnz_wtilde));
        let (gap_mean, gap_q95) = mean_and_q95(l.iter().map(|s| s.relative_gap()));
        let stats = json!({
            "lambda": self.lambda,
            "tau": self.tau,
            "tol": self.tol,
            "outer_iters_mean": outer_mean,
            "outer_iters_q95": outer_q95,
            "active_size_mean": active_mean,
            "active_size_q95": active_q95,
            "nnz_w_mean": nnz_mean,
            "nnz_w_q95": nnz_q95,
            "sparsified_searches_total": l.iter().map(|s| u64::from(s.sparsified_searches)).sum::<u64>(),
            "exact_searches_total": l.iter().map(|s| u64::from(s.exact_searches)).sum::<u64>(),
            "certified_searches_total": l.iter().map(|s| u64::from(s.certified_searches)).sum::<u64>(),
            "truncated_searches_total": l.iter().map(|s| u64::from(s.truncated_searches)).sum::<u64>(),
            "nnz_wtilde_mean": wtilde_mean,
            "nnz_wtilde_q95": wtilde_q95,
            "cd_steps_total": l.iter().map(|s| s.cd_steps).sum::<u64>(),
            "relative_gap_bound_mean": gap_mean,
            "relative_gap_bound_q95": gap_q95,
            "not_converged": l.iter().filter(|s| !s.converged).count(),
            "labels_without_positives": l.iter().filter(|s| s.n_positives == 0).count(),
        });
        let summary =
            FitSummary::new("ppdsparse", t.seconds, t.threads, t.nnz_before_pruning, t.nnz_after_pruning, stats);
        Ok(Fitted { model: t.model, summary })
    }
}

/// What training returns: the pruned model, per-label statistics and totals.
#[derive(Debug)]
pub struct PpdTrained {
    /// The pruned model.
    pub model: SparseModel,
    /// One entry per label, in label order.
    pub labels: Vec<PpdLabelStats>,
    /// Wall time of [`PpdSparseConfig::train`].
    pub seconds: f64,
    /// rayon threads used.
    pub threads: usize,
    /// Non-zero weights (biases included) before pruning.
    pub nnz_before_pruning: usize,
    /// Non-zero weights (biases included) after pruning.
    pub nnz_after_pruning: usize,
}

/// What the solver did for one label.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PpdLabelStats {
    /// The label.
    pub label: u32,
    /// |P|.
    pub n_positives: usize,
    /// Outer iterations of Alg. 1.
    pub outer_iters: u32,
    /// Coordinate steps of Alg. 2 over all outer iterations.
    pub cd_steps: u64,
    /// |A| at the end.
    pub active_size: usize,
    /// Searches with the sparsified w̃ of Alg. 3.
    pub sparsified_searches: u32,
    /// Searches with w itself (including the final one).
    pub exact_searches: u32,
    /// Of the exact searches, those certified by the positive part of w (x ≥ 0): the others
    /// walked every column of w.
    pub certified_searches: u32,
    /// Searches with the truncated w (when Alg. 3 would not sparsify).
    pub truncated_searches: u32,
    /// Mean nnz(w̃) over the sparsified searches (0 without any).
    pub mean_nnz_wtilde: f64,
    /// Primal objective F(w(α)) at the end (eq. 9), or an upper bound of it when
    /// `primal_is_bound` (the final search was certified, see `certified_searches`).
    pub primal: f64,
    /// Whether `primal` (hence the gap) is an upper bound rather than the exact value.
    pub primal_is_bound: bool,
    /// Dual objective G(α) at the end (eq. 10); the duality gap is `primal + dual`.
    pub dual: f64,
    /// Whether the stopping rule held before `max_iter` ran out.
    pub converged: bool,
    /// Non-zero weights (bias included) before pruning.
    pub nnz_before_pruning: usize,
    /// Non-zero weights (bias included) after pruning.
    pub nnz_after_pruning: usize,
    /// Wall time of this label.
    pub seconds: f64,
}

impl crate::ova::LabelStat for PpdLabelStats {
    fn shared_as(&self, label: usize) -> Self {
        Self { label: label as u32, seconds: 0.0, ..self.clone() }
    }
}

impl PpdLabelStats {
    /// The duality gap F + G (≥ 0 up to rounding), or an upper bound of it when
    /// `primal_is_bound`.
    pub fn gap(&self) -> f64 {
        self.primal + self.dual
    }

    /// The duality gap relative to F (F > 0 whenever there is a sample).
    pub fn relative_gap(&self) -> f64 {
        self.gap() / self.primal.abs().max(f64::MIN_POSITIVE)
    }
}

/// The column-major copy of X (without the bias column), each column's entries sorted by
/// |x_ij| descending (ties by row) so that a walk can stop at a magnitude threshold
/// (\[P\] Sect. 5.3).
#[derive(Clone, Debug, PartialEq)]
pub struct Csc {
    col_ptr: Vec<usize>,
    rows: Vec<u32>,
    values: Vec<f32>,
}

impl Csc {
    /// Transposes canonical CSR rows; each column's entries by row ascending, or by |value|
    /// descending (then row) when `by_magnitude` (for \[P\] Sect. 5.3's column threshold).
    pub fn new(x: &SparseRows, by_magnitude: bool) -> Self {
        let d = x.n_cols;
        let mut col_ptr = vec![0usize; d + 1];
        x.indices.iter().for_each(|&c| col_ptr[c as usize + 1] += 1);
        for j in 0..d {
            col_ptr[j + 1] += col_ptr[j];
        }
        let mut fill = col_ptr.clone();
        let mut entries = vec![(0u32, 0f32); x.indices.len()];
        for i in 0..x.n_rows() {
            for at in x.indptr[i]..x.indptr[i + 1] {
                let c = x.indices[at] as usize;
                entries[fill[c]] = (i as u32, x.values[at]);
                fill[c] += 1;
            }
        }
        // Filled row by row, each column is already by row ascending.
        if by_magnitude {
            for j in 0..d {
                entries[col_ptr[j]..col_ptr[j + 1]].sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then(a.0.cmp(&b.0)));
            }
        }
        let (rows, values) = entries.into_iter().unzip();
        Self { col_ptr, rows, values }
    }

    /// Number of stored entries of column j.
    #[inline]
    pub fn col_len(&self, j: usize) -> usize {
        self.col_ptr[j + 1] - self.col_ptr[j]
    }

    /// Column j: (rows, values), in the order [`Csc::new`] was asked for.
    #[inline]
    pub fn col(&self, j: usize) -> (&[u32], &[f32]) {
        let r = self.col_ptr[j]..self.col_ptr[j + 1];
        (&self.rows[r.clone()], &self.values[r])
    }
}

/// Algorithm 3 (random sparsification): R draws of j with probability |w_j|/‖w‖₁, and
/// `w̃ = (‖w‖₁/R) Σ_draws sign(w_j) e_j`, an unbiased estimate of w with at most R non-zeros.
/// `w` holds the non-zero (feature, weight) pairs; the output keeps their order. `cumulative`
/// and `counts` are scratch.
pub fn random_sparsify(
    w: &[(u32, f64)],
    r: usize,
    rng: &mut Rng,
    cumulative: &mut Vec<f64>,
    counts: &mut Vec<u32>,
    out: &mut Vec<(u32, f64)>,
) {
    out.clear();
    cumulative.clear();
    let mut total = 0.0;
    for &(_, v) in w {
        total += v.abs();
        cumulative.push(total);
    }
    if r == 0 || !(total > 0.0) {
        return;
    }
    counts.clear();
    counts.resize(w.len(), 0);
    for _ in 0..r {
        let u = rng.random::<f64>() * total;
        // The first entry whose cumulative mass exceeds u; zero weights are never drawn.
        let at = cumulative.partition_point(|&c| c <= u).min(w.len() - 1);
        counts[at] += 1;
    }
    let scale = total / r as f64;
    for (&(j, v), &c) in w.iter().zip(counts.iter()) {
        if c > 0 {
            out.push((j, v.signum() * c as f64 * scale));
        }
    }
}

/// The sample count R of Theorem 4.1, `⌈2‖w‖₁²/δ²⌉`, or `None` when it is not below `nnz`
/// (then w itself is sparser than any w̃) or δ = 0.
fn sparsify_draws(l1: f64, delta: f64, nnz: usize) -> Option<usize> {
    if delta == 0.0 {
        return None;
    }
    let r = (2.0 * l1 * l1 / (delta * delta)).ceil();
    (r >= 1.0 && r < nnz as f64).then_some(r as usize)
}

/// `sign(v) max(|v| − λ, 0)`, without branches: the sign of v is data, so a branch on it is
/// mispredicted about half the time (it was the costliest instruction of Alg. 2 on Bibtex).
#[inline]
fn soft_threshold(v: f64, lambda: f64) -> f64 {
    (v.abs() - lambda).max(0.0).copysign(v)
}

/// Read-only data shared by every label of a fit.
struct Shared<'a> {
    x: &'a SparseRows,
    rows: Rows<'a>,
    csc: Csc,
    /// ‖x_i‖², bias feature included.
    sq_norms: Vec<f64>,
    /// max_i |x_ij| of each column j (0 for empty columns).
    col_max: Vec<f64>,
    bias: bool,
    /// Every x_ij ≥ 0 (bag-of-words and tf-idf rows): the exact search can be certified by
    /// the positive part of w ([`Label::certified_search`]).
    nonnegative: bool,
}

impl<'a> Shared<'a> {
    /// With `column_threshold`, columns are stored by |x_ij| descending so the threshold cuts
    /// a prefix; otherwise by row, so a walk's writes to the scores move forward through memory.
    fn new(x: &'a SparseRows, bias: bool, column_threshold: bool) -> Self {
        let sq_norms = (0..x.n_rows())
            .map(|i| {
                let v = &x.values[x.indptr[i]..x.indptr[i + 1]];
                v.iter().map(|&a| a as f64 * a as f64).sum::<f64>() + bias as usize as f64
            })
            .collect();
        let csc = Csc::new(x, column_threshold);
        let col_max = (0..x.n_cols).map(|j| csc.col(j).1.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64).collect();
        let nonnegative = x.values.iter().all(|&v| v >= 0.0);
        Self { x, rows: Rows::new(x, bias), csc, sq_norms, col_max, bias, nonnegative }
    }

    fn n_features(&self) -> usize {
        self.x.n_cols
    }

    fn n_vars(&self) -> usize {
        self.x.n_cols + self.bias as usize
    }
}

/// Per-thread state of one label's solve. Dense vectors are zero (labels −1, flags false)
/// between labels; [`Scratch::reset`] restores that by walking the lists of what was touched.
struct Scratch {
    /// α, length n.
    alpha: Vec<f64>,
    /// y_i ∈ {−1, +1}, length n.
    y: Vec<f64>,
    /// i ∈ A, length n.
    in_active: Vec<bool>,
    /// A, in insertion order.
    active: Vec<u32>,
    /// v = X̂ᵀα, length d + bias.
    v: Vec<f64>,
    /// w(α) = prox_λ(v)/τ, length d + bias: the solution after a solve.
    w: Vec<f64>,
    /// Coordinates j < d whose v_j was ever changed (the support of w is inside).
    touched_cols: Vec<u32>,
    col_mark: Vec<bool>,
    /// Σ_j w̃_j x_ij of the last search, for every row when `dense`, else for the rows in
    /// `touched_rows` (zero elsewhere).
    score: Vec<f64>,
    dense: bool,
    row_mark: Vec<bool>,
    touched_rows: Vec<u32>,
    /// The non-zero (j, w_j), j < d, then w̃ and Alg. 3's scratch.
    w_list: Vec<(u32, f64)>,
    w_tilde: Vec<(u32, f64)>,
    cumulative: Vec<f64>,
    counts: Vec<u32>,
    /// [`Label::truncate`]'s (walk per unit of bound, position in `w_list`).
    by_cost: Vec<(f64, u32)>,
    /// Candidates (−∇_iG, i) of a search.
    candidates: Vec<(f64, u32)>,
    /// Rows outside A by class, [negatives, positives]: bounds the search's scan of untouched
    /// rows (without it, every search would scan all n rows looking for positives outside A).
    n_outside: [usize; 2],
}

impl Scratch {
    fn new(n_vars: usize, n: usize) -> Self {
        Self {
            alpha: vec![0.0; n],
            y: vec![-1.0; n],
            in_active: vec![false; n],
            active: Vec::new(),
            v: vec![0.0; n_vars],
            w: vec![0.0; n_vars],
            touched_cols: Vec::new(),
            col_mark: vec![false; n_vars],
            score: vec![0.0; n],
            dense: false,
            row_mark: vec![false; n],
            touched_rows: Vec::new(),
            w_list: Vec::new(),
            w_tilde: Vec::new(),
            cumulative: Vec::new(),
            counts: Vec::new(),
            by_cost: Vec::new(),
            candidates: Vec::new(),
            n_outside: [0, 0],
        }
    }

    /// Puts i into A and its coordinates into `touched_cols` (the support of v, hence of w,
    /// is inside the union of A's rows).
    fn activate(&mut self, x: &SparseRows, i: u32) {
        self.in_active[i as usize] = true;
        self.n_outside[(self.y[i as usize] > 0.0) as usize] -= 1;
        self.active.push(i);
        for &j in &x.indices[x.indptr[i as usize]..x.indptr[i as usize + 1]] {
            if !self.col_mark[j as usize] {
                self.col_mark[j as usize] = true;
                self.touched_cols.push(j);
            }
        }
    }

    /// Zeroes everything the last label touched (α lives only on A: no α_i > 0 leaves A).
    fn reset(&mut self, shared: &Shared) {
        for &i in &self.active {
            self.alpha[i as usize] = 0.0;
            self.in_active[i as usize] = false;
            self.y[i as usize] = -1.0;
        }
        self.active.clear();
        for &j in &self.touched_cols {
            self.v[j as usize] = 0.0;
            self.w[j as usize] = 0.0;
            self.col_mark[j as usize] = false;
        }
        self.touched_cols.clear();
        if shared.bias {
            let b = shared.n_features();
            self.v[b] = 0.0;
            self.w[b] = 0.0;
        }
        self.clear_scores();
    }

    fn clear_scores(&mut self) {
        if self.dense {
            self.score.fill(0.0);
            self.dense = false;
        }
        for &i in &self.touched_rows {
            self.score[i as usize] = 0.0;
            self.row_mark[i as usize] = false;
        }
        self.touched_rows.clear();
    }

    /// The bias weight w_0 (0 without bias).
    fn bias_weight(&self, shared: &Shared) -> f64 {
        if shared.bias { self.w[shared.n_features()] } else { 0.0 }
    }

    /// The weights with |w| ≥ `threshold` as sorted (feature, weight) pairs and the bias, the
    /// same as [`crate::dismec::prune`] on the dense w but O(touched) instead of O(d).
    fn pruned(&self, shared: &Shared, threshold: f64) -> (Vec<u32>, Vec<f32>, f32) {
        let mut kept: Vec<u32> = self
            .touched_cols
            .iter()
            .copied()
            .filter(|&j| {
                let v = self.w[j as usize];
                v.abs() >= threshold && v != 0.0
            })
            .collect();
        kept.sort_unstable();
        let weights = kept.iter().map(|&j| self.w[j as usize] as f32).collect();
        let b = self.bias_weight(shared);
        (kept, weights, if shared.bias && b.abs() >= threshold { b as f32 } else { 0.0 })
    }

    /// Collects the non-zero (j, w_j), j < d, into `w_list`; returns ‖w_{≠0}‖₁.
    fn collect_support(&mut self) -> f64 {
        self.w_list.clear();
        let mut l1 = 0.0;
        for &j in &self.touched_cols {
            let v = self.w[j as usize];
            if v != 0.0 {
                self.w_list.push((j, v));
                l1 += v.abs();
            }
        }
        l1
    }
}

/// Bounded top-κ collection of search candidates by (−∇_iG descending, index ascending):
/// the buffer is cut back to its κ best whenever it reaches 2κ + 64 entries, and later entries
/// below the κ-th best so far are not kept (they cannot be in the top κ). Without the cut, an
/// early search of a label proposes half of the n rows and sorting them dominated the search.
struct TopK {
    kappa: usize,
    cut: f64,
}

impl TopK {
    fn order(a: &(f64, u32), b: &(f64, u32)) -> std::cmp::Ordering {
        b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
    }

    /// `kappa` ≥ 1.
    fn new(kappa: usize) -> Self {
        Self { kappa, cut: f64::NEG_INFINITY }
    }

    #[inline]
    fn push(&mut self, buf: &mut Vec<(f64, u32)>, item: (f64, u32)) {
        if item.0 < self.cut {
            return;
        }
        buf.push(item);
        if buf.len() >= 2 * self.kappa + 64 {
            buf.select_nth_unstable_by(self.kappa - 1, Self::order);
            buf.truncate(self.kappa);
            // The κ-th best violation: everything kept is at least this.
            self.cut = buf.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
        }
    }

    /// The κ best of `buf`, sorted.
    fn finish(&self, buf: &mut Vec<(f64, u32)>) {
        if buf.len() > self.kappa {
            buf.select_nth_unstable_by(self.kappa - 1, Self::order);
            buf.truncate(self.kappa);
        }
        buf.sort_unstable_by(Self::order);
    }
}

/// What a label's scratch scores hold for its current w.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scores {
    /// Nothing usable (an approximate search, or w changed since).
    Stale,
    /// The exact margins of every row ([`Label::margins`] with `exact`).
    Exact,
    /// Upper bounds of the margins, exact on the rows checked ([`Label::certified_search`]).
    Bounds,
}

/// One label's problem: parameters, data and the label's scratch.
struct Label<'s, 'a> {
    lambda: f64,
    tau: f64,
    shared: &'s Shared<'a>,
    s: &'s mut Scratch,
}

impl Label<'_, '_> {
    /// ∇_iG = y_i wᵀx_i + α_i − 1 (eq. 12 plus the squared hinge's α_i).
    #[inline]
    fn gradient(&self, i: usize) -> f64 {
        self.s.y[i] * self.shared.rows.dot(i, &self.s.w) + self.s.alpha[i] - 1.0
    }

    /// ∇_iG during Alg. 2, reading v instead of w: `w_j = prox_λ(v_j)/τ` is recomputed per
    /// entry (the same expression [`Label::sync_w`] stores, so the same value bit for bit as
    /// [`Label::gradient`] after a sync, summed in the same order as [`Rows::dot`]). Alg. 2 then
    /// touches one dense vector instead of two: the random reads of w and v were its cost.
    #[inline]
    fn gradient_from_v(&self, i: usize) -> f64 {
        let x = self.shared.x;
        let (lambda, inv_tau) = (self.lambda, 1.0 / self.tau);
        let v = &self.s.v;
        let r = x.indptr[i]..x.indptr[i + 1];
        let (cols, vals) = (&x.indices[r.clone()], &x.values[r]);
        let w = |j: u32| soft_threshold(v[j as usize], lambda) * inv_tau;
        let mut acc = [0.0f64; 4];
        let (cc, vc) = (cols.chunks_exact(4), vals.chunks_exact(4));
        let (c_rest, v_rest) = (cc.remainder(), vc.remainder());
        for (c, xv) in cc.zip(vc) {
            for l in 0..4 {
                acc[l] += xv[l] as f64 * w(c[l]);
            }
        }
        let mut tail = if self.shared.bias { v[x.n_cols] * inv_tau } else { 0.0 };
        for (&c, &xv) in c_rest.iter().zip(v_rest) {
            tail += xv as f64 * w(c);
        }
        let dot = (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail;
        self.s.y[i] * dot + self.s.alpha[i] - 1.0
    }

    /// v += delta·x_i (delta = Δα_i y_i), eq. 13; w is brought up to date by [`Label::sync_w`].
    /// i is in A, so its coordinates are already in `touched_cols` ([`Scratch::activate`]).
    fn update(&mut self, i: usize, delta: f64) {
        let x = self.shared.x;
        let s = &mut *self.s;
        let r = x.indptr[i]..x.indptr[i + 1];
        for (&j, &xij) in x.indices[r.clone()].iter().zip(&x.values[r]) {
            s.v[j as usize] += delta * xij as f64;
        }
        if self.shared.bias {
            s.v[x.n_cols] += delta;
        }
    }

    /// w_j = prox_λ(v_j)/τ (eq. 13) on every coordinate v may have changed on (`touched_cols`
    /// and the bias): O(|touched_cols|) once per Alg. 2 call.
    fn sync_w(&mut self) {
        let (lambda, inv_tau) = (self.lambda, 1.0 / self.tau);
        let s = &mut *self.s;
        for &j in &s.touched_cols {
            let j = j as usize;
            s.w[j] = soft_threshold(s.v[j], lambda) * inv_tau;
        }
        if self.shared.bias {
            let b = self.shared.n_features();
            s.w[b] = s.v[b] * inv_tau;
        }
    }

    /// Algorithm 2: up to `sweeps` sweeps over A, each in a fresh random order (project choice,
    /// where \[P\] draws i ~ U(A) with replacement; see the module docs), of the steps
    /// `α_i ← max(α_i − ∇_iG/H_ii, 0)` with `H_ii = ‖x_i‖²/τ + 1`. Stops after a sweep in which
    /// every coordinate had a projected gradient ≤ `tol` (project choice: later sweeps would
    /// barely move α). Steps read v ([`Label::gradient_from_v`]); w is synced at the end.
    /// Returns the number of steps.
    fn coordinate_descent(&mut self, sweeps: usize, tol: f64, rng: &mut Rng) -> u64 {
        let n_active = self.s.active.len();
        if n_active == 0 {
            return 0;
        }
        let mut steps = 0u64;
        for _ in 0..sweeps {
            let mut max_pg = 0.0f64;
            rng::shuffle(&mut self.s.active, rng);
            for at in 0..n_active {
                let i = self.s.active[at] as usize;
                let g = self.gradient_from_v(i);
                let old = self.s.alpha[i];
                max_pg = max_pg.max(if old > 0.0 { g.abs() } else { -g });
                let h = self.shared.sq_norms[i] / self.tau + 1.0;
                let new = (old - g / h).max(0.0);
                if new != old {
                    self.s.alpha[i] = new;
                    self.update(i, (new - old) * self.s.y[i]);
                }
            }
            steps += n_active as u64;
            if max_pg <= tol {
                break;
            }
        }
        self.sync_w();
        steps
    }

    /// The truncated search list (used when Alg. 3 would not sparsify, see the module doc):
    /// `w_tilde` = the entries of `w_list` without the columns dropped greedily by walk length
    /// per unit of their bound `|w_j| max_i |x_ij|`, as long as the dropped bounds sum to at most
    /// `budget`, so that no row's score is off by more than `budget`. Returns whether this at
    /// least halves the walk (otherwise the exact search costs little more).
    fn truncate(&mut self, budget: f64) -> bool {
        let (csc, col_max) = (&self.shared.csc, &self.shared.col_max);
        let s = &mut *self.s;
        s.by_cost.clear();
        let mut full = 0usize;
        for (at, &(j, wj)) in s.w_list.iter().enumerate() {
            let len = csc.col_len(j as usize);
            full += len;
            s.by_cost.push((len as f64 / (wj.abs() * col_max[j as usize]), at as u32));
        }
        s.by_cost.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        s.counts.clear();
        s.counts.resize(s.w_list.len(), 1);
        let mut used = 0.0;
        for &(_, at) in &s.by_cost {
            let (j, wj) = s.w_list[at as usize];
            let bound = wj.abs() * col_max[j as usize];
            if used + bound <= budget {
                used += bound;
                s.counts[at as usize] = 0;
            }
        }
        s.w_tilde.clear();
        let mut kept = 0usize;
        for (&(j, wj), &keep) in s.w_list.iter().zip(&s.counts) {
            if keep != 0 {
                s.w_tilde.push((j, wj));
                kept += csc.col_len(j as usize);
            }
        }
        2 * kept <= full
    }

    /// Alg. 1 step 4: drops the negatives with α_i = 0 from A.
    fn shrink(&mut self) {
        let s = &mut *self.s;
        let (alpha, y, in_active, n_outside) = (&s.alpha, &s.y, &mut s.in_active, &mut s.n_outside);
        s.active.retain(|&i| {
            let keep = alpha[i as usize] > 0.0 || y[i as usize] > 0.0;
            if !keep {
                in_active[i as usize] = false;
                n_outside[0] += 1;
            }
            keep
        });
    }

    /// max over A of the projected gradient: |∇_iG| if α_i > 0, max(−∇_iG, 0) at the bound.
    fn projected_gradient(&self) -> f64 {
        self.s
            .active
            .iter()
            .map(|&i| {
                let g = self.gradient(i as usize);
                if self.s.alpha[i as usize] > 0.0 { g.abs() } else { (-g).max(0.0) }
            })
            .fold(0.0, f64::max)
    }

    /// Eq. 14 without the bias: `score_i = Σ_j w̃_j x_ij` by walking the columns of `w_tilde`
    /// (the exact w when `exact`), each stopped at |x_ij| < `threshold`.
    ///
    /// When the walk covers at least n entries the scores are dense: every row is scored and
    /// none is marked (zero-filling n scores costs less than the walk). Otherwise the rows met
    /// are marked in `touched_rows`, and the others score 0.
    fn margins(&mut self, exact: bool, threshold: f32) {
        self.s.clear_scores();
        let csc = &self.shared.csc;
        let s = &mut *self.s;
        let list = if exact { &s.w_list } else { &s.w_tilde };
        let walk: usize = list.iter().map(|&(j, _)| csc.col_len(j as usize)).sum();
        let score = &mut s.score[..];
        s.dense = walk >= score.len();
        // Room for every row the walk can meet, plus the slot the last one is written to.
        let mut n_touched = 0;
        s.touched_rows.resize(if s.dense { 0 } else { walk + 1 }, 0);
        for &(j, wj) in list {
            let (rows, vals) = csc.col(j as usize);
            // With a threshold, entries are sorted by |x_ij| descending: it cuts a prefix.
            let len = if threshold > 0.0 { vals.partition_point(|x| x.abs() >= threshold) } else { vals.len() };
            let (rows, vals) = (&rows[..len], &vals[..len]);
            if s.dense {
                for (&i, &x) in rows.iter().zip(vals) {
                    score[i as usize] += wj * x as f64;
                }
            } else {
                // Without a branch on the mark (met rows come in no predictable order): every
                // row is written at the end of the list, which grows only if it was new.
                let touched = &mut s.touched_rows[..];
                for (&i, &x) in rows.iter().zip(vals) {
                    touched[n_touched] = i;
                    n_touched += usize::from(!s.row_mark[i as usize]);
                    s.row_mark[i as usize] = true;
                    score[i as usize] += wj * x as f64;
                }
            }
        }
        s.touched_rows.truncate(n_touched);
    }

    /// Alg. 1 step 2 after [`Label::margins`]: the at most `kappa` indices i ∉ A with the largest
    /// `−∇_iG = 1 − y_i(score_i + w_0)` above `min_violation`, into `candidates`, by violation
    /// descending then index ascending. Untouched rows score w_0 alone; among them (all tied
    /// within a class) the lowest indices are taken.
    fn select(&mut self, kappa: usize, min_violation: f64) {
        let b = self.s.bias_weight(self.shared);
        let s = &mut *self.s;
        s.candidates.clear();
        if kappa == 0 {
            return;
        }
        let mut top = TopK::new(kappa);
        if s.dense {
            for (i, (&score, &y)) in s.score.iter().zip(&s.y).enumerate() {
                let violation = 1.0 - y * (score + b);
                if violation > min_violation && !s.in_active[i] {
                    top.push(&mut s.candidates, (violation, i as u32));
                }
            }
        } else {
            // Touched rows outside A, by class [negatives, positives].
            let mut touched_outside = [0usize; 2];
            for &i in &s.touched_rows {
                let i = i as usize;
                if !s.in_active[i] {
                    touched_outside[(s.y[i] > 0.0) as usize] += 1;
                    let violation = 1.0 - s.y[i] * (s.score[i] + b);
                    if violation > min_violation {
                        top.push(&mut s.candidates, (violation, i as u32));
                    }
                }
            }
            // Untouched rows outside A score w_0 alone: −∇_iG = 1 + w_0 (negatives), 1 − w_0
            // (positives). Up to κ of each violating class, lowest indices first.
            let violation = [1.0 + b, 1.0 - b];
            let mut wanted = [0usize; 2];
            for c in 0..2 {
                if violation[c] > min_violation {
                    wanted[c] = kappa.min(s.n_outside[c] - touched_outside[c]);
                }
            }
            if wanted[0] + wanted[1] > 0 {
                for i in 0..s.y.len() {
                    if s.row_mark[i] || s.in_active[i] {
                        continue;
                    }
                    let c = (s.y[i] > 0.0) as usize;
                    if wanted[c] > 0 {
                        wanted[c] -= 1;
                        top.push(&mut s.candidates, (violation[c], i as u32));
                        if wanted[0] + wanted[1] == 0 {
                            break;
                        }
                    }
                }
            }
        }
        top.finish(&mut s.candidates);
    }

    /// Keeps the candidates of an approximate search whose exact `−∇_iG = 1 − y_i wᵀx_i`
    /// (α_i = 0 outside A) exceeds `min_violation`, O(d̄) each: without this, candidates that
    /// only w̃ makes look violating are added, shrunk away, and proposed again.
    fn verify_candidates(&mut self, min_violation: f64) {
        let mut candidates = std::mem::take(&mut self.s.candidates);
        candidates.retain_mut(|(violation, i)| {
            *violation = -self.gradient(*i as usize);
            *violation > min_violation
        });
        self.s.candidates = candidates;
    }

    /// Whether [`Label::certified_search`] gives the exact search's candidates: x ≥ 0, every
    /// positive in A (positives are never dropped from it), and `1 + w_0 ≤ tol`.
    fn can_certify(&self, tol: f64) -> bool {
        self.shared.nonnegative && self.s.n_outside[1] == 0 && 1.0 + self.s.bias_weight(self.shared) <= tol
    }

    /// The exact search's candidates (the κ rows outside A with the largest −∇_iG > `tol`)
    /// walking only the columns with w_j > 0. Outside A every row is a negative, with
    /// `−∇_iG = 1 + w_0 + wᵀx_i`, and with x ≥ 0
    ///
    /// ```text
    /// wᵀx_i ≤ z⁺_i = Σ_{j: w_j > 0} w_j x_ij,
    /// ```
    ///
    /// so a row with `1 + w_0 + z⁺_i ≤ tol` (every row the walk does not meet, as
    /// [`Label::can_certify`] asks `1 + w_0 ≤ tol`) cannot violate; the others get their exact
    /// gradient from their row (O(d̄) each). The columns of the frequent features, which make
    /// most of an exact walk, mostly carry negative weights (they occur in many negatives).
    /// The scores are left as upper bounds of the margins wᵀx_i (exact on the rows checked),
    /// which bound F from above in [`Label::primal`] after [`Label::exact_margins_on_active`].
    fn certified_search(&mut self, kappa: usize, tol: f64) {
        let s = &mut *self.s;
        s.w_tilde.clear();
        s.w_tilde.extend(s.w_list.iter().filter(|&&(_, w)| w > 0.0));
        self.margins(false, 0.0);
        let b = self.s.bias_weight(self.shared);
        let mut top = TopK::new(kappa.max(1));
        let mut candidates = std::mem::take(&mut self.s.candidates);
        candidates.clear();
        // The rows the walk met: all of them when it was dense.
        let touched = std::mem::take(&mut self.s.touched_rows);
        let every_row = 0..if self.s.dense { self.s.y.len() } else { 0 };
        for i in every_row.chain(touched.iter().map(|&i| i as usize)) {
            if self.s.in_active[i] || 1.0 + b + self.s.score[i] <= tol {
                continue;
            }
            let margin = self.shared.rows.dot(i, &self.s.w) - b;
            self.s.score[i] = margin;
            let violation = 1.0 + b + margin;
            if violation > tol {
                top.push(&mut candidates, (violation, i as u32));
            }
        }
        top.finish(&mut candidates);
        self.s.candidates = candidates;
        self.s.touched_rows = touched;
    }

    /// Exact margins wᵀx_i (bias excluded) into the scores of the rows of A, marking them, so
    /// that [`Label::primal`] after [`Label::certified_search`] is exact on A and an upper bound
    /// elsewhere (a negative's squared hinge grows with its margin).
    fn exact_margins_on_active(&mut self) {
        let b = self.s.bias_weight(self.shared);
        for at in 0..self.s.active.len() {
            let i = self.s.active[at] as usize;
            let margin = self.shared.rows.dot(i, &self.s.w) - b;
            let s = &mut *self.s;
            if !s.dense && !s.row_mark[i] {
                s.row_mark[i] = true;
                s.touched_rows.push(i as u32);
            }
            s.score[i] = margin;
        }
    }

    /// F(w) (eq. 9) from the exact margins of the last [`Label::margins`] call with `exact`.
    fn primal(&self, n_positives: usize) -> f64 {
        let s = &*self.s;
        let b = s.bias_weight(self.shared);
        let hinge = |m: f64| 0.5 * (1.0 - m).max(0.0).powi(2);
        if s.dense {
            let loss: f64 = s.score.iter().zip(&s.y).map(|(&z, &y)| hinge(y * (z + b))).sum();
            let l1: f64 = s.w_list.iter().map(|&(_, v)| v.abs()).sum();
            let sq: f64 = s.w_list.iter().map(|&(_, v)| v * v).sum::<f64>() + b * b;
            return self.lambda * l1 + 0.5 * self.tau * sq + loss;
        }
        let (mut loss, mut touched_pos) = (0.0, 0usize);
        for &i in &s.touched_rows {
            let i = i as usize;
            loss += hinge(s.y[i] * (s.score[i] + b));
            touched_pos += (s.y[i] > 0.0) as usize;
        }
        let n = s.y.len();
        let untouched_pos = n_positives - touched_pos;
        let untouched_neg = n - s.touched_rows.len() - untouched_pos;
        loss += untouched_pos as f64 * hinge(b) + untouched_neg as f64 * hinge(-b);
        let l1: f64 = s.w_list.iter().map(|&(_, v)| v.abs()).sum();
        let sq: f64 = s.w_list.iter().map(|&(_, v)| v * v).sum::<f64>() + b * b;
        self.lambda * l1 + 0.5 * self.tau * sq + loss
    }

    /// G(α) (eq. 10 with the squared hinge).
    fn dual(&self) -> f64 {
        let s = &*self.s;
        let b = s.bias_weight(self.shared);
        let sq: f64 = s.touched_cols.iter().map(|&j| s.w[j as usize].powi(2)).sum::<f64>() + b * b;
        let (mut a_sq, mut a_sum) = (0.0, 0.0);
        for &i in &s.active {
            let a = s.alpha[i as usize];
            a_sq += a * a;
            a_sum += a;
        }
        0.5 * self.tau * sq + 0.5 * a_sq - a_sum
    }
}

/// Algorithm 1 for label `k`: leaves w(α) in `scratch.w` (support in `scratch.touched_cols`)
/// and returns the stats; the caller resets the scratch.
fn solve_label(
    config: &PpdSparseConfig,
    shared: &Shared,
    positives: &[u32],
    k: usize,
    scratch: &mut Scratch,
) -> PpdLabelStats {
    let start = Instant::now();
    let mut rng = rng::seeded(config.seed, k as u64);
    let n = scratch.y.len();
    scratch.n_outside = [n - positives.len(), positives.len()];
    for &i in positives {
        scratch.y[i as usize] = 1.0;
    }
    for &i in positives {
        scratch.activate(shared.x, i);
    }
    let mut st = PpdLabelStats { label: k as u32, n_positives: positives.len(), ..Default::default() };
    let mut label = Label { lambda: config.lambda, tau: config.tau, shared, s: scratch };
    let threshold = config.column_threshold as f32;
    let mut wtilde_sum = 0.0;
    // What the scores held by the scratch are for the current w.
    let mut scores = Scores::Stale;
    for _ in 0..config.max_iter {
        st.outer_iters += 1;
        st.cd_steps += label.coordinate_descent(config.inner_sweeps, config.tol, &mut rng);
        label.shrink();
        // PG over A, computed only when a search leaves no candidate (only then can the label
        // stop; the searches change neither α nor w, so it is the same value as before them).
        let mut pg: Option<f64> = None;
        let l1 = label.s.collect_support();
        let kappa = if config.kappa == 0 { label.s.active.len().max(config.min_kappa).max(1) } else { config.kappa };
        // An approximate search (Alg. 3's w̃, or the truncated w when Alg. 3 would not
        // sparsify) proposes candidates; only when it finds none and A is solved does the exact
        // search (w̃ = w) decide convergence. A certified exact search costs little more than an
        // approximate one and proposes the true top κ, so it replaces it when it can.
        let approximate = !label.can_certify(config.tol)
            && label.approximate_search_vector(config, l1, &mut rng, &mut st, &mut wtilde_sum);
        let mut exact = true;
        if approximate {
            label.margins(false, threshold);
            label.select(kappa, config.tol);
            label.verify_candidates(config.tol);
            exact =
                label.s.candidates.is_empty() && *pg.get_or_insert_with(|| label.projected_gradient()) <= config.tol;
            scores = Scores::Stale;
        }
        if exact {
            st.exact_searches += 1;
            if label.can_certify(config.tol) {
                label.certified_search(kappa, config.tol);
                st.certified_searches += 1;
                scores = Scores::Bounds;
            } else {
                label.margins(true, 0.0);
                label.select(kappa, config.tol);
                scores = Scores::Exact;
            }
            if label.s.candidates.is_empty() && *pg.get_or_insert_with(|| label.projected_gradient()) <= config.tol {
                st.converged = true;
                break;
            }
        }
        let s = &mut *label.s;
        for at in 0..s.candidates.len() {
            s.activate(shared.x, s.candidates[at].1);
        }
    }
    label.finish_stats(&mut st, positives.len(), scores, wtilde_sum);
    st.seconds = start.elapsed().as_secs_f64();
    st
}

impl Label<'_, '_> {
    /// The vector an approximate search uses, if any: Alg. 3's w̃ (into `s.w_tilde`) when it
    /// sparsifies w (of ℓ1 norm `l1`), else w truncated to within `δ/2` when it drops
    /// something. Returns whether there is one (false: only the exact search is left).
    fn approximate_search_vector(
        &mut self,
        config: &PpdSparseConfig,
        l1: f64,
        rng: &mut Rng,
        st: &mut PpdLabelStats,
        wtilde_sum: &mut f64,
    ) -> bool {
        if let Some(r) = sparsify_draws(l1, config.delta, self.s.w_list.len()) {
            let s = &mut *self.s;
            random_sparsify(&s.w_list, r, rng, &mut s.cumulative, &mut s.counts, &mut s.w_tilde);
            st.sparsified_searches += 1;
            *wtilde_sum += s.w_tilde.len() as f64;
            true
        } else if config.delta > 0.0 && self.truncate(0.5 * config.delta) {
            st.truncated_searches += 1;
            true
        } else {
            false
        }
    }

    /// The final w's primal and dual objectives, active set and non-zeros in `st`; the margins
    /// are recomputed first unless the last search was on the final w (converged on `scores`
    /// exact or bounds: then F is bounded above, see [`Label::certified_search`]).
    /// `wtilde_sum` sums the sizes of the w̃s searched with.
    fn finish_stats(&mut self, st: &mut PpdLabelStats, n_positives: usize, scores: Scores, wtilde_sum: f64) {
        let shared = self.shared;
        if scores == Scores::Stale || !st.converged {
            // The last search ran before the last steps (or on w̃): margins of the final w for F.
            self.s.collect_support();
            self.margins(true, 0.0);
        } else if scores == Scores::Bounds {
            self.exact_margins_on_active();
            st.primal_is_bound = true;
        }
        st.primal = self.primal(n_positives);
        st.dual = self.dual();
        st.active_size = self.s.active.len();
        st.nnz_before_pruning = self.s.w_list.len() + (shared.bias && self.s.bias_weight(shared) != 0.0) as usize;
        if st.sparsified_searches > 0 {
            st.mean_nnz_wtilde = wtilde_sum / f64::from(st.sparsified_searches);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dismec::{Dismec, DismecConfig, InitKind, prune};
    use crate::testutil::{dense_rows, random_dataset};

    fn train_set(seed: u64, n: usize, d: usize, k: usize) -> TrainSet {
        let (x, labels) = random_dataset(seed, n, d, k);
        TrainSet::new(x, &labels).unwrap()
    }

    /// Tight settings: every label solved to the stopping tolerance `tol`, no pruning.
    fn tight(lambda: f64, tau: f64, tol: f64) -> PpdSparseConfig {
        PpdSparseConfig { lambda, tau, tol, max_iter: 100_000, prune_threshold: 0.0, ..Default::default() }
    }

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn labels_of(data: &TrainSet, k: usize) -> Vec<f64> {
        let mut y = vec![-1.0; data.n_samples()];
        data.labels.positives(k).iter().for_each(|&i| y[i as usize] = 1.0);
        y
    }

    /// F(w) of eq. 9 straight from the definition over dense rows (bias last, not ℓ1-penalised).
    fn slow_primal(xd: &[Vec<f64>], y: &[f64], w: &[f64], lambda: f64, tau: f64) -> f64 {
        let d = w.len() - 1;
        let loss: f64 = xd.iter().zip(y).map(|(x, &yi)| 0.5 * (1.0 - yi * dot(x, w)).max(0.0).powi(2)).sum();
        lambda * w[..d].iter().map(|v| v.abs()).sum::<f64>() + 0.5 * tau * dot(w, w) + loss
    }

    #[test]
    fn lambda_zero_equals_dismec_with_c_one_over_two_tau() {
        // F = (τ/2)‖w‖² + ½Σ max(1 − y wᵀx, 0)² = τ·(½‖w‖² + (1/(2τ)) Σ max(...)²): DiSMEC's
        // L with C = 1/(2τ) (C = ½ at τ = 1) has the same minimiser.
        let data = train_set(1, 60, 10, 4);
        for tau in [1.0, 2.0] {
            let ppd = tight(0.0, tau, 1e-11);
            let dismec_config = DismecConfig {
                c: 0.5 / tau,
                eps0: 1e-10,
                prune_threshold: 0.0,
                init: InitKind::Zero,
                ..Default::default()
            };
            let dismec = Dismec::new(&dismec_config).unwrap();
            let stats = dismec.stats(&data);
            for k in 0..data.n_labels() {
                let (w, st) = ppd.train_label(&data, k).unwrap();
                assert!(st.converged, "{st:?}");
                let (reference, _) = dismec.train_label(&data, &stats, k);
                let err = w.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(err <= 1e-5, "tau {tau} label {k}: max |Δw| = {err:e}");
            }
        }
    }

    /// Proximal gradient (ISTA) on F: step 1/L with L = τ + Σ‖x_i‖² ≥ the Lipschitz constant of
    /// the smooth part's gradient, then soft-thresholding by λ/L on every coordinate but the bias.
    fn ista(xd: &[Vec<f64>], y: &[f64], lambda: f64, tau: f64) -> Vec<f64> {
        let nv = xd[0].len();
        let lipschitz = tau + xd.iter().map(|x| dot(x, x)).sum::<f64>();
        let mut w = vec![0.0; nv];
        for _ in 0..2_000_000 {
            let mut g: Vec<f64> = w.iter().map(|v| tau * v).collect();
            for (x, &yi) in xd.iter().zip(y) {
                let slack = (1.0 - yi * dot(x, &w)).max(0.0);
                g.iter_mut().zip(x).for_each(|(gj, xj)| *gj -= yi * slack * xj);
            }
            let mut change = 0.0f64;
            for j in 0..nv {
                let z = w[j] - g[j] / lipschitz;
                let new = if j + 1 == nv { z } else { soft_threshold(z, lambda / lipschitz) };
                change = change.max((new - w[j]).abs());
                w[j] = new;
            }
            if change < 1e-15 {
                return w;
            }
        }
        panic!("ISTA did not converge");
    }

    #[test]
    fn lambda_positive_equals_proximal_gradient_on_the_primal() {
        let data = train_set(2, 50, 8, 3);
        let xd = dense_rows(&data.features, true);
        for (lambda, tau) in [(0.5, 1.0), (2.0, 0.5), (0.1, 3.0)] {
            for k in 0..data.n_labels() {
                let y = labels_of(&data, k);
                let reference = ista(&xd, &y, lambda, tau);
                let (w, st) = tight(lambda, tau, 1e-11).train_label(&data, k).unwrap();
                assert!(st.converged);
                let err = w.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                let scale = reference.iter().map(|v| v.abs()).fold(0.0, f64::max);
                assert!(err <= 1e-6 * scale.max(1.0), "λ {lambda} τ {tau} label {k}: max |Δw| = {err:e}");
                // The ℓ1 term zeroes some features exactly, in both solutions.
                let zeros = |v: &[f64]| v.iter().map(|x| x.abs() < 1e-9).collect::<Vec<_>>();
                assert_eq!(zeros(&w), zeros(&reference), "λ {lambda} τ {tau} label {k}");
                let f_slow = slow_primal(&xd, &y, &w, lambda, tau);
                assert!((st.primal - f_slow).abs() <= 1e-9 * f_slow, "{} vs {f_slow}", st.primal);
            }
        }
        assert!((0..3).any(|k| {
            let (w, _) = tight(0.5, 1.0, 1e-11).train_label(&data, k).unwrap();
            w[..8].contains(&0.0)
        }));
    }

    #[test]
    fn the_duality_gap_closes() {
        let data = train_set(3, 80, 12, 5);
        for (lambda, tau, delta) in [(0.01, 1.0, 1.0), (0.3, 0.5, 0.2), (0.0, 10.0, 0.0)] {
            let config = PpdSparseConfig { delta, ..tight(lambda, tau, 1e-9) };
            for k in 0..data.n_labels() {
                let (_, st) = config.train_label(&data, k).unwrap();
                assert!(st.converged, "{st:?}");
                assert!(st.gap() >= -1e-9 * st.primal, "weak duality: {st:?}");
                assert!(st.relative_gap() <= 1e-6, "λ {lambda} τ {tau} label {k}: {st:?}");
            }
        }
        // A loose tolerance stops early with a visibly larger gap.
        let (_, loose) = tight(0.01, 1.0, 0.5).train_label(&data, 0).unwrap();
        assert!(loose.relative_gap() > 1e-6, "{loose:?}");
    }

    #[test]
    fn random_sparsification_is_unbiased_with_at_most_r_non_zeros() {
        let w: Vec<(u32, f64)> = vec![(0, 0.5), (3, -1.5), (4, 0.05), (7, 2.0), (9, -0.2), (11, 0.75)];
        let l1: f64 = w.iter().map(|p| p.1.abs()).sum();
        let (r, trials) = (8usize, 20_000usize);
        let (mut sum, mut cumulative, mut counts, mut out) = (vec![0.0; w.len()], vec![], vec![], vec![]);
        for seed in 0..trials as u64 {
            let mut rng = rng::seeded(seed, 17);
            random_sparsify(&w, r, &mut rng, &mut cumulative, &mut counts, &mut out);
            assert!(out.len() <= r);
            for &(j, v) in &out {
                let at = w.iter().position(|p| p.0 == j).unwrap();
                assert_eq!(v.signum(), w[at].1.signum());
                sum[at] += v;
            }
        }
        for (at, &(j, wj)) in w.iter().enumerate() {
            // w̃_j = sign(w_j)(‖w‖₁/R)·Binomial(R, p_j): variance (‖w‖₁/R)² R p_j (1 − p_j).
            let p = wj.abs() / l1;
            let se = ((l1 / r as f64).powi(2) * r as f64 * p * (1.0 - p) / trials as f64).sqrt();
            let mean = sum[at] / trials as f64;
            assert!((mean - wj).abs() <= 5.0 * se, "feature {j}: mean {mean} vs {wj} (se {se})");
        }
        // R of Theorem 4.1, and the exact search when R would not be sparser than w.
        assert_eq!(sparsify_draws(3.0, 1.0, 100), Some(18));
        assert_eq!(sparsify_draws(3.0, 1.0, 18), None);
        assert_eq!(sparsify_draws(3.0, 0.0, 100), None);
    }

    /// Sets the scratch's w (its support in `touched_cols`) and returns the rows outside A with
    /// `−∇_iG = 1 − y_i wᵀx_i > tol` for label 0, by violation descending then index, by brute force.
    fn set_weights_and_brute_force(
        scratch: &mut Scratch,
        data: &TrainSet,
        xd: &[Vec<f64>],
        w: &[f64],
        tol: f64,
    ) -> Vec<(f64, u32)> {
        scratch.w.copy_from_slice(w);
        for (j, &v) in w[..w.len() - 1].iter().enumerate() {
            if v != 0.0 {
                scratch.col_mark[j] = true;
                scratch.touched_cols.push(j as u32);
            }
        }
        let y = labels_of(data, 0);
        let mut expected: Vec<(f64, u32)> = (0..data.n_samples())
            .filter(|&i| !scratch.in_active[i])
            .map(|i| (1.0 - y[i] * dot(&xd[i], w), i as u32))
            .filter(|&(v, _)| v > tol)
            .collect();
        expected.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        expected
    }

    /// `got` is the first κ of `expected` (same rows, violations within 1e-12).
    fn assert_top(got: &[(f64, u32)], expected: &[(f64, u32)], kappa: usize, case: usize) {
        let want = &expected[..kappa.min(expected.len())];
        assert_eq!(got.len(), want.len(), "case {case} κ {kappa}");
        for (g, e) in got.iter().zip(want) {
            assert_eq!(g.1, e.1, "case {case} κ {kappa}");
            assert!((g.0 - e.0).abs() <= 1e-12, "case {case}: {g:?} vs {e:?}");
        }
    }

    #[test]
    fn exact_greedy_search_returns_the_brute_force_most_violating_samples() {
        let data = train_set(4, 70, 15, 2);
        let xd = dense_rows(&data.features, true);
        let shared = Shared::new(&data.features, true, false);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let mut r = rng::seeded(9, 0);
        // A sparse w (some features exactly zero, so some rows are untouched) and an arbitrary A.
        let nv = shared.n_vars();
        let positives = data.labels.positives(0);
        for case in 0..6 {
            let w: Vec<f64> = (0..nv)
                .map(|j| if j + 1 < nv && j % 3 != case % 3 { 0.0 } else { r.random_range(-1.0..1.0) })
                .collect();
            for &i in positives {
                scratch.y[i as usize] = 1.0;
            }
            for i in (0..data.n_samples() as u32).filter(|i| i % (case as u32 + 2) == 0) {
                scratch.in_active[i as usize] = true;
                scratch.active.push(i);
            }
            scratch.n_outside = [0, 0];
            for i in (0..data.n_samples()).filter(|&i| !scratch.in_active[i]) {
                scratch.n_outside[(scratch.y[i] > 0.0) as usize] += 1;
            }
            let expected = set_weights_and_brute_force(&mut scratch, &data, &xd, &w, 0.05);
            for kappa in [1, 5, 1000] {
                let mut label = Label { lambda: 0.0, tau: 1.0, shared: &shared, s: &mut scratch };
                label.s.collect_support();
                label.margins(true, 0.0);
                label.select(kappa, 0.05);
                assert_top(&label.s.candidates, &expected, kappa, case);
            }
            scratch.reset(&shared);
            // Positives outside A (only this test builds such an A) are not reset by `reset`.
            positives.iter().for_each(|&i| scratch.y[i as usize] = -1.0);
            assert!(scratch.w.iter().chain(&scratch.score).all(|&v| v == 0.0));
            assert!(scratch.y.iter().all(|&v| v == -1.0) && !scratch.in_active.iter().any(|&a| a));
        }
    }

    #[test]
    fn the_certified_search_proposes_the_exact_searchs_candidates() {
        let data = train_set(4, 90, 15, 2);
        let xd = dense_rows(&data.features, true);
        let shared = Shared::new(&data.features, true, false);
        assert!(shared.nonnegative);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let mut r = rng::seeded(10, 0);
        let (nv, tol) = (shared.n_vars(), 0.05);
        let positives = data.labels.positives(0);
        let mut certified = 0;
        for case in 0..12 {
            // Mixed-sign sparse w, a bias at or below −1 + tol, every positive and some
            // negatives in A, as the solver has them when it searches exactly.
            let mut w: Vec<f64> =
                (0..nv).map(|j| if j % 3 == case % 3 { 0.0 } else { r.random_range(-0.6..0.4) }).collect();
            w[nv - 1] = if case == 11 { -0.9 } else { r.random_range(-1.6..-1.0 + tol) };
            for &i in positives {
                scratch.y[i as usize] = 1.0;
                scratch.in_active[i as usize] = true;
                scratch.active.push(i);
            }
            for i in (0..data.n_samples() as u32).filter(|i| i % (case as u32 + 3) == 0) {
                if !scratch.in_active[i as usize] {
                    scratch.in_active[i as usize] = true;
                    scratch.active.push(i);
                }
            }
            scratch.n_outside = [data.n_samples() - scratch.active.len(), 0];
            let expected = set_weights_and_brute_force(&mut scratch, &data, &xd, &w, tol);
            let mut label = Label { lambda: 0.0, tau: 1.0, shared: &shared, s: &mut scratch };
            label.s.collect_support();
            assert_eq!(label.can_certify(tol), case != 11, "case {case}: bias {}", w[nv - 1]);
            if case == 11 {
                scratch.reset(&shared);
                continue;
            }
            certified += 1;
            for kappa in [1, 4, 1000] {
                label.certified_search(kappa, tol);
                assert_top(&label.s.candidates, &expected, kappa, case);
            }
            // The scores bound every row's margin from above, exactly on A after the fix-up.
            label.exact_margins_on_active();
            for (i, x) in xd.iter().enumerate() {
                let margin = dot(x, &w) - w[nv - 1];
                let held = if label.s.dense || label.s.row_mark[i] { label.s.score[i] } else { 0.0 };
                assert!(held >= margin - 1e-12, "case {case} row {i}: {held} < {margin}");
                if label.s.in_active[i] {
                    assert!((held - margin).abs() <= 1e-12, "case {case} row {i} in A");
                }
            }
            scratch.reset(&shared);
        }
        assert!(certified > 5);
        // A negative feature value, or a positive outside A, rules the certificate out.
        let mut x = data.features.clone();
        x.values[0] = -x.values[0];
        assert!(!Shared::new(&x, true, false).nonnegative);
    }

    #[test]
    fn a_label_converged_on_certified_searches_has_no_violator_left() {
        let data = train_set(11, 300, 40, 6);
        let xd = dense_rows(&data.features, true);
        let config = PpdSparseConfig::default();
        let shared = Shared::new(&data.features, true, false);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let mut certified = 0;
        for k in 0..data.n_labels() {
            let st = solve_label(&config, &shared, data.labels.positives(k), k, &mut scratch);
            assert!(st.converged, "label {k}: {st:?}");
            certified += st.certified_searches;
            // The stopping rule, by brute force over every row outside A: −∇_iG ≤ tol.
            let (y, w) = (labels_of(&data, k), &scratch.w);
            for (i, x) in xd.iter().enumerate().filter(|&(i, _)| !scratch.in_active[i]) {
                let violation = 1.0 - y[i] * dot(x, w);
                assert!(violation <= config.tol + 1e-12, "label {k} row {i}: {violation}");
            }
            // F is exact, or bounded above when the last search was certified.
            let f = slow_primal(&xd, &y, w, config.lambda, config.tau);
            if st.primal_is_bound {
                assert!(st.primal >= f - 1e-9 * f, "label {k}: {} < {f}", st.primal);
            } else {
                assert!((st.primal - f).abs() <= 1e-9 * f, "label {k}: {} vs {f}", st.primal);
            }
            scratch.reset(&shared);
        }
        assert!(certified > 0);
    }

    #[test]
    fn labels_without_positives_share_one_solve_on_every_shard() {
        let data = train_set(12, 60, 12, 40);
        let empty: Vec<usize> = (0..40).filter(|&j| data.labels.positives(j).is_empty()).collect();
        assert!(empty.len() >= 3 && empty[0] < 20 && *empty.last().unwrap() >= 20, "{empty:?}");
        let config = PpdSparseConfig::default();
        let whole = config.train(&data, &crate::Silent).unwrap();
        // Each shard (a rank of a label-parallel run) gives the whole model's labels.
        for shard in [0..20, 20..40, 27..40] {
            let part = config.train_labels(&data, shard.clone(), &crate::Silent).unwrap();
            for (i, k) in shard.enumerate() {
                assert_eq!(part.model.label(i), whole.model.label(k), "label {k}");
            }
        }
        // Every label without positives has the first one's own solution.
        let (dense, st) = config.train_label(&data, empty[0]).unwrap();
        let (f, w, b) = prune(&dense, true, config.prune_threshold);
        for &k in &empty {
            assert_eq!(whole.model.label(k), (&f[..], &w[..], b), "label {k}");
            let nnz_after_pruning = f.len() + (b != 0.0) as usize;
            let shared = PpdLabelStats { label: k as u32, seconds: 0.0, nnz_after_pruning, ..st.clone() };
            assert_eq!(whole.labels[k], shared);
        }
    }

    #[test]
    fn coordinate_steps_read_the_same_gradient_from_v_as_from_w() {
        // gradient_from_v recomputes w_j = prox(v_j)/τ per entry: bit for bit the gradient of
        // the synced w, at any λ (some coordinates thresholded to zero) and τ.
        let data = train_set(10, 90, 14, 3);
        let shared = Shared::new(&data.features, true, false);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let mut r = rng::seeded(3, 0);
        for (lambda, tau) in [(0.0, 1.0), (0.3, 1.0), (1.5, 0.5), (0.05, 4.0)] {
            data.labels.positives(1).iter().for_each(|&i| scratch.y[i as usize] = 1.0);
            scratch.n_outside = [data.n_samples(), data.n_samples()];
            for i in (0..data.n_samples() as u32).filter(|i| i % 3 != 0) {
                scratch.activate(shared.x, i);
            }
            let mut label = Label { lambda, tau, shared: &shared, s: &mut scratch };
            for _ in 0..40 {
                let i = label.s.active[r.random_range(0..label.s.active.len())] as usize;
                let delta = r.random_range(-1.0..1.0);
                label.s.alpha[i] = r.random_range(0.0..1.0);
                label.update(i, delta);
            }
            label.sync_w();
            for i in 0..data.n_samples() {
                assert_eq!(label.gradient_from_v(i).to_bits(), label.gradient(i).to_bits(), "λ {lambda} row {i}");
            }
            for &i in &label.s.active {
                label.s.alpha[i as usize] = 0.0;
            }
            scratch.reset(&shared);
            scratch.y.iter_mut().for_each(|y| *y = -1.0);
        }
    }

    #[test]
    fn bounded_top_k_equals_a_full_sort() {
        let mut r = rng::seeded(11, 0);
        for case in 0..200 {
            let n = r.random_range(0..400usize);
            let kappa = r.random_range(1..60usize);
            // Few distinct violations, so that ties (broken by index) are common.
            let items: Vec<(f64, u32)> =
                (0..n as u32).map(|i| (f64::from(r.random_range(0..(case % 7 + 2) as u32)), i)).collect();
            let mut shuffled = items.clone();
            for at in (1..shuffled.len()).rev() {
                shuffled.swap(at, r.random_range(0..=at));
            }
            let (mut top, mut buf) = (TopK::new(kappa), Vec::new());
            shuffled.iter().for_each(|&c| top.push(&mut buf, c));
            top.finish(&mut buf);
            let mut want = items;
            want.sort_by(TopK::order);
            want.truncate(kappa);
            assert_eq!(buf, want, "case {case}");
        }
    }

    #[test]
    fn the_truncated_search_is_within_its_bound_of_the_exact_one() {
        let data = train_set(12, 120, 30, 2);
        let xd = dense_rows(&data.features, false);
        let shared = Shared::new(&data.features, true, false);
        let mut scratch = Scratch::new(shared.n_vars(), data.n_samples());
        let mut r = rng::seeded(5, 0);
        let d = data.n_features();
        for budget in [0.0, 0.05, 0.5, 3.0, 1e9] {
            let w: Vec<f64> = (0..d).map(|j| if j % 4 == 1 { 0.0 } else { r.random_range(-1.0..1.0) }).collect();
            scratch.w[..d].copy_from_slice(&w);
            for (j, &v) in w.iter().enumerate() {
                if v != 0.0 {
                    scratch.col_mark[j] = true;
                    scratch.touched_cols.push(j as u32);
                }
            }
            let mut label = Label { lambda: 0.0, tau: 1.0, shared: &shared, s: &mut scratch };
            label.s.collect_support();
            let halves = label.truncate(budget);
            let kept = label.s.w_tilde.clone();
            let dropped: f64 = label
                .s
                .w_list
                .iter()
                .filter(|p| !kept.contains(p))
                .map(|&(j, v)| v.abs() * shared.col_max[j as usize])
                .sum();
            assert!(dropped <= budget * (1.0 + 1e-12), "budget {budget}: dropped {dropped}");
            assert!(kept.iter().all(|p| label.s.w_list.contains(p)));
            if budget == 0.0 {
                assert_eq!(kept, label.s.w_list);
                assert!(!halves);
            }
            if budget == 1e9 {
                assert!(kept.is_empty() && halves);
            }
            label.margins(false, 0.0);
            for (i, x) in xd.iter().enumerate() {
                let exact = dot(&x[..d], &w);
                let err = (label.s.score[i] - exact).abs();
                assert!(err <= budget + 1e-9, "budget {budget} row {i}: {err}");
            }
            scratch.reset(&shared);
        }
    }

    #[test]
    fn the_model_does_not_depend_on_the_thread_count() {
        let data = train_set(5, 300, 40, 12);
        let config = PpdSparseConfig { delta: 5.0, ..Default::default() };
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| config.train(&data, &crate::Silent).unwrap())
        };
        let one = run(1);
        assert_eq!(one.threads, 1);
        assert!(one.labels.iter().any(|s| s.sparsified_searches > 0), "the test should exercise Alg. 3");
        let iters = |t: &PpdTrained| t.labels.iter().map(|s| (s.outer_iters, s.cd_steps)).collect::<Vec<_>>();
        for threads in [2, 4] {
            let other = run(threads);
            assert_eq!(other.threads, threads);
            assert_eq!(one.model.to_bytes(), other.model.to_bytes(), "{threads} threads");
            assert_eq!(iters(&one), iters(&other));
        }
        // Tagging-like unit rows (a few common features with small values in every row, as
        // after tf-idf), the default δ and λ = 0.01 (a denser w): the truncated search runs too.
        let (rare, labels) = random_dataset(5, 300, 40, 12);
        let mut x = farout_data::SparseRows::new(48);
        for i in 0..rare.n_rows() {
            let (c, v) = rare.row(i);
            let cols: Vec<u32> = (0..8).chain(c.iter().map(|&c| c + 8)).collect();
            let vals: Vec<f32> = [0.05; 8].iter().chain(v).copied().collect();
            x.push_row(&cols, &vals);
        }
        x.normalize_rows();
        let unit = TrainSet::new(x, &labels).unwrap();
        let denser = PpdSparseConfig { lambda: 0.01, ..Default::default() };
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| denser.train(&unit, &crate::Silent).unwrap())
        };
        let one = run(1);
        assert!(one.labels.iter().any(|s| s.truncated_searches > 0), "the test should exercise truncation");
        assert_eq!(one.model.to_bytes(), run(2).model.to_bytes());
        // Another seed changes the random draws but not the (converged) solution much.
        let reseeded = PpdSparseConfig { seed: 7, ..config.clone() }.train(&data, &crate::Silent).unwrap();
        assert_ne!(iters(&one), iters(&reseeded));
    }

    #[test]
    fn pruning_equals_dismec_prune_on_the_dense_weights_and_fit_reports_stats() {
        let data = train_set(6, 200, 30, 8);
        let config = PpdSparseConfig { lambda: 0.0, ..Default::default() };
        let trained = config.train(&data, &crate::Silent).unwrap();
        for k in 0..data.n_labels() {
            let (dense, _) = config.train_label(&data, k).unwrap();
            let (f, w, b) = prune(&dense, true, config.prune_threshold);
            assert_eq!(trained.model.label(k), (&f[..], &w[..], b), "label {k}");
        }
        assert!(trained.nnz_after_pruning < trained.nnz_before_pruning);
        let fitted = LinearSolver::fit(&config, &data, &crate::Silent).unwrap();
        assert_eq!(fitted.model, trained.model);
        assert_eq!(fitted.summary.solver, "ppdsparse");
        for key in ["outer_iters_mean", "active_size_q95", "nnz_w_mean", "relative_gap_bound_q95", "not_converged"] {
            assert!(fitted.summary.stats.contains_key(key), "{key}");
        }
    }

    #[test]
    fn without_bias_the_solution_still_closes_its_gap() {
        let data = train_set(7, 60, 10, 3);
        let config = PpdSparseConfig { bias: false, ..tight(0.1, 1.0, 1e-9) };
        let xd = dense_rows(&data.features, false);
        for k in 0..data.n_labels() {
            let (w, st) = config.train_label(&data, k).unwrap();
            assert_eq!(w.len(), data.n_features());
            assert!(st.converged && st.relative_gap() <= 1e-6, "{st:?}");
            let y = labels_of(&data, k);
            let loss: f64 = xd.iter().zip(&y).map(|(x, &yi)| 0.5 * (1.0 - yi * dot(x, &w)).max(0.0).powi(2)).sum();
            let f = 0.1 * w.iter().map(|v| v.abs()).sum::<f64>() + 0.5 * dot(&w, &w) + loss;
            assert!((f - st.primal).abs() <= 1e-9 * f);
        }
    }

    #[test]
    fn a_training_set_without_samples_is_an_error() {
        let data = TrainSet::new(farout_data::SparseRows::new(3), &farout_data::LabelSets::new(2)).unwrap();
        let config = PpdSparseConfig::default();
        assert!(matches!(config.train(&data, &crate::Silent), Err(Error::Shape { .. })));
        let data = train_set(8, 10, 3, 2);
        assert!(matches!(config.train_label(&data, 2), Err(Error::Shape { .. })));
    }

    #[test]
    fn defaults_pass_check_and_an_empty_table_gives_them() {
        let c: PpdSparseConfig = toml::from_str("").unwrap();
        assert_eq!(c, PpdSparseConfig::default());
        assert_eq!((c.lambda, c.tau, c.bias, c.prune_threshold), (0.03, 1.0, true, 0.01));
        c.check().unwrap();
        assert!(toml::from_str::<PpdSparseConfig>("lamda = 0.1").is_err());
        let c: PpdSparseConfig = toml::from_str("lambda = 0.1\ntau = 10.0").unwrap();
        assert_eq!((c.lambda, c.tau), (0.1, 10.0));
    }

    #[test]
    fn check_names_the_key_of_each_bad_value() {
        let d = PpdSparseConfig::default;
        let cases: [(PpdSparseConfig, &str); 9] = [
            (PpdSparseConfig { lambda: -0.1, ..d() }, "`lambda` = -0.1: must be"),
            (PpdSparseConfig { tau: 0.0, ..d() }, "`tau` = 0: must be"),
            (PpdSparseConfig { max_iter: 0, ..d() }, "`max_iter` = 0: must be"),
            (PpdSparseConfig { inner_sweeps: 0, ..d() }, "`inner_sweeps` = 0: must be"),
            (PpdSparseConfig { delta: f64::NAN, ..d() }, "`delta` = NaN: must be"),
            (PpdSparseConfig { column_threshold: -1.0, ..d() }, "`column_threshold` = -1: must be"),
            (PpdSparseConfig { tol: 0.0, ..d() }, "`tol` = 0: must be"),
            (PpdSparseConfig { tol: f64::INFINITY, ..d() }, "`tol` = inf: must be"),
            (PpdSparseConfig { prune_threshold: -0.5, ..d() }, "`prune_threshold` = -0.5: must be"),
        ];
        for (c, expect) in cases {
            let msg = c.check().unwrap_err().to_string();
            assert!(msg.contains(expect), "{msg:?} should contain {expect:?}");
            let data = train_set(9, 10, 3, 1);
            assert!(matches!(c.train(&data, &crate::Silent), Err(Error::Param(_))));
        }
    }
}
