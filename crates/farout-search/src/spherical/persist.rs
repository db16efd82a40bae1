//! The saved form of [`SphericalIndex`] (`crate::persist`): parameters, norm bound, centroids,
//! every row's cluster and drift reference, every cluster's members in order with their row
//! copies, and the calibrations; with `pq4` scoring then the 4-bit codebook and every cluster's
//! mean, or an empty codebook while no lone query has made them. What follows from those is
//! computed again on loading: the centroids' first D coordinates and their codes, the
//! clusters' int8 and 4-bit codes (coding a copy gives the codes it had), and every row's
//! place in its cluster.
//!
//! [`SphericalIndex`]: super::SphericalIndex

use super::calibrate::Calibrations;
use super::cluster::Cluster;
use super::{Scoring, SphericalConfig, SphericalIndex, centroid_views};
use crate::Rows;
use crate::augment::NormAugmentation;
use crate::persist::{Dec, Enc, Problem, expect_len, inconsistent};
use crate::quant::QuantRows;
use farout_core::ClassId;

impl SphericalIndex {
    /// Writes the index's state (see the module docs).
    pub(super) fn save(&self, out: &mut Enc) {
        out.config(&self.config);
        out.f32(self.augmentation.bound());
        out.matrix(&self.centroids);
        out.u32s(&self.assign);
        out.f32s(&self.assigned_cos);
        out.u64(self.clusters.len() as u64);
        for c in &self.clusters {
            out.u32s(&c.ids);
            out.f32s(&c.rows);
        }
        out.u8(self.rebuild as u8);
        self.calibrations.save(out);
        if self.config.scoring == Scoring::Pq4 {
            super::pq4::save(&self.pq4, &self.clusters, out);
        }
    }

    /// Reads what [`SphericalIndex::save`] wrote for the rows `w`, checking that every row sits
    /// in exactly the cluster it is assigned to.
    pub(crate) fn restore(dec: &mut Dec, w: Rows) -> Result<Self, Problem> {
        let (n, d) = (w.len(), w.dim());
        let config: SphericalConfig = dec.config("spherical")?;
        crate::IndexParams::check(&config).map_err(inconsistent)?;
        if config.scoring == Scoring::Auto {
            return Err(inconsistent("the spherical index's scoring is not resolved to f32, int8 or pq4"));
        }
        let augmentation = NormAugmentation::with_bound(dec.f32()?).ok_or_else(|| inconsistent("the norm bound"))?;
        let centroids = dec.matrix()?;
        if centroids.cols() != d + 1 || centroids.rows() == 0 {
            return Err(inconsistent(format!("{} x {} centroids for rows of {d}", centroids.rows(), centroids.cols())));
        }
        let c = centroids.rows();
        let (assign, assigned_cos) = (dec.u32s()?, dec.f32s()?);
        expect_len(&assign, n, "cluster assignments")?;
        expect_len(&assigned_cos, n, "drift references")?;
        if dec.usize_at_most(c, "clusters")? != c {
            return Err(inconsistent("fewer clusters than centroids"));
        }
        let mut pos = vec![u32::MAX; n];
        let mut clusters = Vec::with_capacity(c);
        for j in 0..c {
            let (ids, rows) = (dec.u32s()?, dec.f32s()?);
            expect_len(&rows, ids.len() * d, "copied values in a cluster")?;
            place_members(j, &ids, &assign, &mut pos)?;
            let codes = config.scoring.int8_codes().then(|| {
                let mut codes = QuantRows::with_capacity(d, ids.len());
                rows.chunks_exact(d.max(1)).for_each(|r| codes.push(r));
                codes
            });
            clusters.push(Cluster { ids, rows, codes, pq4: Default::default() });
        }
        if pos.contains(&u32::MAX) {
            return Err(inconsistent("a row is in no cluster"));
        }
        let rebuild = dec.u8()? != 0;
        let calibrations = Calibrations::restore(dec, d)?;
        // Written only with `pq4` scoring, which files of earlier builds never name (and
        // always wrote a codebook for).
        let pq4 = match config.scoring {
            Scoring::Pq4 => super::pq4::restore(dec, &clusters, d)?,
            _ => Default::default(),
        };
        let (centroids_d, centroid_codes) = centroid_views(&centroids, d, config.scoring);
        Ok(Self {
            config,
            augmentation,
            centroids,
            centroids_d,
            centroid_codes,
            assign,
            assigned_cos,
            pos,
            clusters,
            rebuild,
            calibrations,
            pq4,
        })
    }
}

/// Records the place of cluster `j`'s members `ids` in `pos`, checking each is a row assigned
/// to `j` and not yet placed.
fn place_members(j: usize, ids: &[ClassId], assign: &[u32], pos: &mut [u32]) -> Result<(), Problem> {
    for (at, &i) in ids.iter().enumerate() {
        let i = i as usize;
        if i >= assign.len() || assign[i] as usize != j || pos[i] != u32::MAX {
            return Err(inconsistent(format!("cluster {j} lists row {i}, which is not its member")));
        }
        pos[i] = at as u32;
    }
    Ok(())
}
