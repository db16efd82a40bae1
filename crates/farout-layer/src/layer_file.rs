//! An output layer's checkpoint file (`layer.bin`, written by [`crate::OutputLayer::save`]) as
//! plain data, without building a layer: read, joined over the ranks that each wrote their
//! classes (every P-th, [`Strided`]), dealt to another number of ranks, and written again. Moving
//! rows changes no value, so a layer re-sharded from P to P' ranks and back is the same file.
//!
//! The format (little-endian): the 8-byte magic `FAROUTL1`; five u64, the rows n, the
//! dimension d, 1 if there is a bias, the optimiser's step, the length of W's optimiser state
//! (n d for AdaGrad, 0 for SGD); then f32 arrays: W (n x d, row-major), the bias (n values if
//! any), W's optimiser state, the bias's optimiser state (one value per row when W has state).

use crate::Error;
use farout_core::binio::{read_f32s, read_u64, write_f32s, write_u64};
use farout_dist::Strided;
use std::io::{Read, Write};
use std::path::Path;

/// The magic bytes that open a layer file.
const MAGIC: &[u8; 8] = b"FAROUTL1";
/// Bytes before the arrays: the magic and five u64.
const HEADER_BYTES: u64 = 8 + 5 * 8;

/// The contents of one `layer.bin`: a slice of the classes' rows of W, their bias and their
/// optimiser state.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerFile {
    /// Rows (classes) held.
    pub rows: usize,
    /// Dimension of a row.
    pub d: usize,
    /// The optimiser's step count (the same on every rank of a run).
    pub step: u64,
    /// W, `rows x d` row-major.
    pub w: Vec<f32>,
    /// The bias, one per row, if the layer has one.
    pub bias: Option<Vec<f32>>,
    /// W's optimiser state, `rows x d` (empty for a stateless optimiser).
    pub state_w: Vec<f32>,
    /// The bias's optimiser state, one per row (empty for a stateless optimiser).
    pub state_b: Vec<f32>,
}

impl LayerFile {
    /// Reads `path`, checking its sizes against the file's length before allocating.
    pub fn read(path: &Path) -> Result<LayerFile, Error> {
        let io = |e: std::io::Error| Error::Checkpoint { path: path.to_path_buf(), msg: e.to_string() };
        let (mut f, [rows, d, bias, step, state]) = open_checked(path)?;
        let stateful = state != 0;
        let (rows, d) = (rows as usize, d as usize);
        let mut read = |n: usize| -> Result<Vec<f32>, Error> {
            let mut v = vec![0f32; n];
            read_f32s(&mut f, &mut v).map_err(io)?;
            Ok(v)
        };
        let w = read(rows * d)?;
        let bias = if bias == 1 { Some(read(rows)?) } else { None };
        let state_w = read(state as usize)?;
        let state_b = read(if stateful { rows } else { 0 })?;
        Ok(LayerFile { rows, d, step, w, bias, state_w, state_b })
    }

    /// Writes the file (the format [`crate::OutputLayer::load`] reads).
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let parts = Parts {
            rows: self.rows,
            d: self.d,
            step: self.step,
            w: &self.w,
            bias: self.bias.as_deref(),
            state_w: &self.state_w,
            state_b: &self.state_b,
        };
        parts.write(path)
    }

    /// The layer of `parts`' rows one after the other (the contiguous slices of ranks 0, 1, ...,
    /// as class-sharded runs wrote them before classes were dealt, [`LayerFile::undeal`]). The parts
    /// must agree on the dimension, the bias, the optimiser and its step; the error says which
    /// part differs and how.
    pub fn concat(parts: &[LayerFile]) -> Result<LayerFile, String> {
        let first = parts.first().ok_or("no layer files to join")?;
        let mut out =
            LayerFile { rows: 0, w: Vec::new(), bias: first.bias.as_ref().map(|_| Vec::new()), ..first.clone() };
        out.state_w.clear();
        out.state_b.clear();
        for (r, p) in parts.iter().enumerate() {
            let differs = |what: &str, a: String, b: String| format!("part {r} holds {what} {a}, part 0 {b}");
            if p.d != first.d {
                return Err(differs("rows of dimension", p.d.to_string(), first.d.to_string()));
            }
            if p.bias.is_some() != first.bias.is_some() || p.state_w.is_empty() != first.state_w.is_empty() {
                let shape =
                    |f: &LayerFile| format!("(bias {}, optimiser state {})", f.bias.is_some(), !f.state_w.is_empty());
                return Err(differs("a layer", shape(p), shape(first)));
            }
            if p.step != first.step {
                return Err(differs("optimiser step", p.step.to_string(), first.step.to_string()));
            }
            out.rows += p.rows;
            out.w.extend_from_slice(&p.w);
            if let (Some(b), Some(pb)) = (&mut out.bias, &p.bias) {
                b.extend_from_slice(pb);
            }
            out.state_w.extend_from_slice(&p.state_w);
            out.state_b.extend_from_slice(&p.state_b);
        }
        Ok(out)
    }

    /// The layer of the parts that ranks `0..P` of a class-sharded run wrote, each holding every
    /// P-th class ([`Strided`]: rank r the classes r, r + P, ...), in class order. The parts
    /// must agree as for [`LayerFile::concat`] and hold the rows their rank holds.
    pub fn undeal(parts: &[LayerFile]) -> Result<LayerFile, String> {
        let joined = Self::concat(parts)?;
        let (rows, ranks) = (joined.rows, parts.len());
        let counts = Strided::counts(rows, ranks);
        if let Some(r) = (0..ranks).find(|&r| parts[r].rows != counts[r]) {
            return Err(format!(
                "part {r} holds {} rows; of {rows} classes dealt over {ranks} ranks, rank {r} holds {}",
                parts[r].rows, counts[r]
            ));
        }
        Ok(joined.pick(Strided::joined_positions(rows, ranks).into_iter(), rows))
    }

    /// The rows rank `rank` of `ranks` holds (every `ranks`-th class from `rank`, [`Strided`]),
    /// with their bias and optimiser state.
    pub fn deal(&self, rank: usize, ranks: usize) -> LayerFile {
        let n = Strided::count(self.rows, rank, ranks);
        self.pick((0..n).map(|l| l * ranks + rank), n)
    }

    /// The `n` rows `rows` (and their bias and optimiser state), in that order.
    fn pick(&self, rows: impl Iterator<Item = usize> + Clone, n: usize) -> LayerFile {
        let d = self.d;
        let of = |v: &[f32], width: usize| {
            if v.is_empty() {
                return Vec::new();
            }
            let mut out = Vec::with_capacity(n * width);
            rows.clone().for_each(|r| out.extend_from_slice(&v[r * width..(r + 1) * width]));
            out
        };
        LayerFile {
            rows: n,
            d,
            step: self.step,
            w: of(&self.w, d),
            bias: self.bias.as_ref().map(|b| of(b, 1)),
            state_w: of(&self.state_w, d),
            state_b: of(&self.state_b, 1),
        }
    }
}

/// A layer file's contents, borrowed: what [`LayerFile::write`] and
/// [`crate::OutputLayer::save`] write, without copying a layer's arrays.
pub(crate) struct Parts<'a> {
    pub rows: usize,
    pub d: usize,
    pub step: u64,
    pub w: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub state_w: &'a [f32],
    pub state_b: &'a [f32],
}

impl Parts<'_> {
    /// Writes the file: the magic, the header, then the arrays (see the module docs).
    pub(crate) fn write(&self, path: &Path) -> Result<(), Error> {
        let err = |e: std::io::Error| Error::Checkpoint { path: path.to_path_buf(), msg: e.to_string() };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(err)?);
        f.write_all(MAGIC).map_err(err)?;
        let header =
            [self.rows as u64, self.d as u64, u64::from(self.bias.is_some()), self.step, self.state_w.len() as u64];
        for h in header {
            write_u64(&mut f, h).map_err(err)?;
        }
        for part in [self.w, self.bias.unwrap_or(&[]), self.state_w, self.state_b] {
            write_f32s(&mut f, part).map_err(err)?;
        }
        f.flush().map_err(err)
    }
}

/// Reads the magic and the five header values (rows, dimension, bias flag, optimiser step,
/// optimiser values of W) of the layer file `path` open in `f`.
fn read_header(f: &mut impl Read, path: &Path) -> Result<[u64; 5], Error> {
    let err = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic).map_err(|e| err(e.to_string()))?;
    if magic != *MAGIC {
        return Err(err("not a farout output-layer checkpoint".into()));
    }
    let mut h = [0u64; 5];
    for x in &mut h {
        *x = read_u64(f).map_err(|e| err(e.to_string()))?;
    }
    Ok(h)
}

/// Opens the layer file `path` and reads its header (as [`read_header`]), checking that the
/// file's length is the header's sizes exactly (before anything is allocated or overwritten):
/// a truncated or foreign file is an error naming the sizes.
pub(crate) fn open_checked(path: &Path) -> Result<(std::io::BufReader<std::fs::File>, [u64; 5]), Error> {
    let err = |msg: String| Error::Checkpoint { path: path.to_path_buf(), msg };
    let io = |e: std::io::Error| err(e.to_string());
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut f = std::io::BufReader::new(file);
    let h = read_header(&mut f, path)?;
    let [rows, d, bias, _, state] = h;
    let values = (|| {
        let wlen = rows.checked_mul(d)?;
        if bias > 1 || (state != 0 && state != wlen) {
            return None;
        }
        let per_row = bias + u64::from(state != 0);
        wlen.checked_add(state)?.checked_add(rows.checked_mul(per_row)?)
    })();
    let expected = values.and_then(|v| v.checked_mul(4)?.checked_add(HEADER_BYTES));
    if expected != Some(len) {
        return Err(err(format!(
            "header says {rows} rows of {d} (bias flag {bias}, {state} optimiser values) but the file has {len} \
             bytes: it is truncated or not a layer file"
        )));
    }
    Ok((f, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OptimizerConfig, OutputLayer, OutputLayerConfig};
    use farout_core::{Matrix, rng};
    use farout_estimators::{Batch, Exact, Softmax};

    fn layer(shard: Strided, bias: bool, adagrad: bool) -> OutputLayer {
        let cfg = OutputLayerConfig { bias, ..OutputLayerConfig::default() };
        let opt = if adagrad {
            OptimizerConfig::Adagrad { lr: 0.5, eps: 1e-8, l2: 0.0 }
        } else {
            OptimizerConfig::Sgd { lr: 0.5, decay: 0.0, l2: 0.0 }
        };
        OutputLayer::with_classes(shard, 5, &cfg, &opt, 7).unwrap()
    }

    /// A layer of 11 classes after one step (so that its bias and optimiser state are not 0).
    fn trained(bias: bool, adagrad: bool) -> OutputLayer {
        let mut l = layer(Strided::whole(11), bias, adagrad);
        let phi = Matrix::from_vec(2, 5, (0..10).map(|i| i as f32 * 0.1 - 0.3).collect()).unwrap();
        let pos: [&[u32]; 2] = [&[3], &[9]];
        l.train_step(&Exact::new(Softmax), Batch::new(&phi, &pos), &mut rng::seeded(0, 0), false);
        l
    }

    #[test]
    fn a_saved_layer_reads_writes_and_reshards_to_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for (bias, adagrad) in [(true, true), (false, false), (true, false), (false, true)] {
            let whole = trained(bias, adagrad);
            let path = dir.path().join("layer.bin");
            whole.save(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let file = LayerFile::read(&path).unwrap();
            assert_eq!((file.rows, file.d, file.bias.is_some()), (11, 5, bias));
            assert_eq!(file.w, whole.weights().as_slice());
            assert_eq!(file.step, 1);
            assert_eq!(file.state_w.iter().any(|&a| a > 0.0), adagrad);
            assert_eq!(file.bias.as_ref().is_some_and(|b| b.iter().any(|&x| x != 0.0)), bias);
            // 11 rows as 3 ranks hold them (dealt), joined again: the same file.
            let parts: Vec<LayerFile> = (0..3).map(|r| file.deal(r, 3)).collect();
            assert_eq!(parts.iter().map(|p| p.rows).collect::<Vec<_>>(), vec![4, 4, 3]);
            let again = dir.path().join("again.bin");
            LayerFile::undeal(&parts).unwrap().write(&again).unwrap();
            assert!(std::fs::read(&again).unwrap() == bytes, "bias {bias}, adagrad {adagrad}");
            // Parts in the wrong order are not the layer (and are caught when their sizes differ).
            let swapped = [parts[1].clone(), parts[0].clone(), parts[2].clone()];
            assert!(LayerFile::undeal(&swapped).unwrap() != LayerFile::undeal(&parts).unwrap());
            let e = LayerFile::undeal(&[parts[2].clone(), parts[1].clone(), parts[0].clone()]).unwrap_err();
            assert!(e.contains("part 0 holds 3 rows; of 11 classes dealt over 3 ranks, rank 0 holds 4"), "{e}");
            // A part written is what a layer of those classes loads: rank 1 holds 1, 4, 7, 10.
            parts[1].write(&again).unwrap();
            let mut part = layer(Strided::new(11, 1, 3).unwrap(), bias, adagrad);
            part.load(&again).unwrap();
            for (l, c) in [1, 4, 7, 10].into_iter().enumerate() {
                assert_eq!(part.weights().row(l), whole.weights().row(c));
            }
        }
    }

    #[test]
    fn parts_that_do_not_belong_together_and_short_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        layer(Strided::whole(4), true, true).save(&path).unwrap();
        let a = LayerFile::read(&path).unwrap();
        let mut b = a.clone();
        b.step += 1;
        let e = LayerFile::concat(&[a.clone(), b]).unwrap_err();
        assert!(e.contains("part 1 holds optimiser step 1, part 0 0"), "{e}");
        let e = LayerFile::concat(&[a.clone(), LayerFile { bias: None, ..a.clone() }]).unwrap_err();
        assert!(e.contains("part 1 holds a layer (bias false"), "{e}");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = LayerFile::read(&path).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&path, b"FAROUTL2").unwrap();
        assert!(LayerFile::read(&path).unwrap_err().to_string().contains("not a farout output-layer checkpoint"));
    }
}
