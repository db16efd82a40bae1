//! The validation metric of every trial against the search's seconds (one colour per rung),
//! with the best finished figure so far as a step line: `progress.png` and `progress.svg`.

use super::Metric;
use super::trials::{Stop, Trial};
use crate::Error;
use crate::compare::CompareError;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Writes `progress.png` and `progress.svg` into `out`.
pub(super) fn plot(out: &Path, trials: &[Trial], metric: &Metric) -> Result<(), Error> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).map_err(|_| {
        CompareError::Plot { path: out.join("progress.png"), msg: "the embedded font failed to load".into() }
    })?;
    for name in ["progress.png", "progress.svg"] {
        let path = out.join(name);
        let drawn = if name.ends_with("png") {
            draw(BitMapBackend::new(&path, (900, 560)).into_drawing_area(), trials, metric)
        } else {
            draw(SVGBackend::new(&path, (900, 560)).into_drawing_area(), trials, metric)
        };
        drawn.map_err(|msg| CompareError::Plot { path: path.clone(), msg })?;
    }
    Ok(())
}

/// The best figure so far after each trial (trials cut by the budget or failed do not count).
fn best_so_far(trials: &[Trial], higher: bool) -> Vec<(f64, f64)> {
    let mut best: Option<f64> = None;
    let mut line = Vec::new();
    let mut sorted: Vec<&Trial> = trials.iter().collect();
    sorted.sort_by(|a, b| a.elapsed.total_cmp(&b.elapsed));
    for t in sorted {
        if let (Some(m), false) = (t.metric, matches!(t.stop, Stop::Budget | Stop::Failed)) {
            best = Some(match best {
                Some(b) if (higher && b >= m) || (!higher && b <= m) => b,
                _ => m,
            });
        }
        if let Some(b) = best {
            line.push((t.elapsed, b));
        }
    }
    line
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, trials: &[Trial], metric: &Metric) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let pts: Vec<(f64, f64, usize)> = trials.iter().filter_map(|t| t.metric.map(|m| (t.elapsed, m, t.rung))).collect();
    let t_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max) * 1.05;
    let lo = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let pad = ((hi - lo) * 0.08).max(1e-3);
    let y = if lo.is_finite() { (lo - pad)..(hi + pad) } else { 0.0..1.0 };
    let title = format!("farout tune: validation {} against search time", metric.name);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..t_max, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("search seconds")
        .y_desc(format!("validation {}", metric.name))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    let rungs = pts.iter().map(|p| p.2).max().unwrap_or(0);
    for rung in 0..=rungs {
        let c = Palette99::pick(rung).to_rgba();
        let at: Vec<(f64, f64)> = pts.iter().filter(|p| p.2 == rung).map(|p| (p.0, p.1)).collect();
        chart
            .draw_series(at.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?
            .label(format!("rung {rung}"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
    }
    let line = best_so_far(trials, metric.higher);
    let mut steps = Vec::new();
    for w in line.windows(2) {
        steps.extend([w[0], (w[1].0, w[0].1)]);
    }
    steps.extend(line.last().copied());
    chart
        .draw_series(LineSeries::new(steps, BLACK.stroke_width(2)))
        .map_err(err)?
        .label("best so far")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(if metric.higher { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
