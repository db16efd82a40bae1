//! The curves of a comparison: the kind's metric against training seconds (left) and epochs
//! (right), one line per run, as PNG and SVG.

use super::{CompareError, Kind, Run};
use crate::Error;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::path::Path;

/// A plotting failure as text (the backends' error types differ).
#[derive(Debug)]
struct DrawError(String);

type DrawResult = Result<(), DrawError>;

/// Writes `curves.png` and `curves.svg` into `out`.
pub(super) fn plot(out: &Path, runs: &[Run]) -> Result<(), Error> {
    let png = out.join("curves.png");
    let svg = out.join("curves.svg");
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |DrawError(msg)| Error::from(CompareError::Plot { path, msg })
    };
    // Text needs a font and the machine may have none: DejaVu Sans is compiled in.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| DrawError("the embedded DejaVu Sans font failed to load".into()))
        .map_err(failed(&png))?;
    draw(BitMapBackend::new(&png, (1400, 600)).into_drawing_area(), runs).map_err(failed(&png))?;
    draw(SVGBackend::new(&svg, (1400, 600)).into_drawing_area(), runs).map_err(failed(&svg))?;
    Ok(())
}

/// Tick labels of the log time axis: as many decimals as the magnitude needs.
fn seconds_label(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.1e}")
    }
}

/// The ranges of the axes over every run's points.
struct Ranges {
    /// The last training time.
    t_last: f64,
    /// The first positive training time (infinite when there is none).
    t_lo: f64,
    /// The log time axis: from a power of ten to past the last time.
    t_min: f64,
    t_max: f64,
    /// The epochs axis.
    epochs: std::ops::Range<f64>,
    /// The metric's axis.
    y: std::ops::Range<f64>,
}

impl Ranges {
    fn of(runs: &[Run], kind: Kind) -> Self {
        let points = runs.iter().flat_map(|r| r.curve.iter());
        let t_last = points.clone().map(|p| p.0).fold(0.0f64, f64::max).max(1e-3);
        let t_max = t_last * 1.3;
        // The first positive training time (infinite when there is none).
        let t_lo = points.clone().map(|p| p.0).filter(|&t| t > 0.0).fold(f64::INFINITY, f64::min);
        // Start the log axis at a power of ten so that it carries at least two labelled decades.
        let t_min = 10f64.powf(t_lo.min(t_max / 10.0).log10().floor());
        let e_max = points.clone().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.05;
        // From 0, or from just before the first point when every run resumed late in training.
        let e_first = points.clone().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let e_min = if e_first > 0.5 * e_max { e_first - 0.05 * (e_max - e_first) } else { 0.0 };
        let y = match kind {
            Kind::Classifier => 0.0..(points.map(|p| p.2).fold(0.0f64, f64::max) * 1.1).clamp(0.05, 1.0),
            Kind::SkipGram => {
                // An objective: the span of the values with a margin.
                let lo = points.clone().map(|p| p.2).fold(f64::INFINITY, f64::min);
                let hi = points.map(|p| p.2).fold(f64::NEG_INFINITY, f64::max);
                let pad = ((hi - lo) * 0.08).max(1e-3);
                if lo.is_finite() { lo - pad..hi + pad } else { 0.0..1.0 }
            }
        };
        Self { t_last, t_lo, t_min, t_max, epochs: e_min..e_max, y }
    }
}

/// The runs' methods in the order they first appear (one colour each).
fn methods_in_order(runs: &[Run]) -> Vec<&str> {
    let mut m: Vec<&str> = Vec::new();
    runs.iter().for_each(|r| {
        if !m.contains(&r.method.as_str()) {
            m.push(&r.method)
        }
    });
    m
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, runs: &[Run]) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| DrawError(e.to_string());
    root.fill(&WHITE).map_err(err)?;
    let task = runs[0].summary.task();
    let kind = runs[0].summary.kind();
    let label = kind.metric_label();
    let root = root.titled(&format!("{task}: {label} by method"), ("sans-serif", 24)).map_err(err)?;
    let (left, right) = root.split_horizontally(700);
    let Ranges { t_last, t_lo, t_min, t_max, epochs, y: y_range } = Ranges::of(runs, kind);
    let methods = methods_in_order(runs);
    let color = |r: &Run| Palette99::pick(methods.iter().position(|m| *m == r.method).unwrap_or(0)).to_rgba();
    // Left: against training seconds, linear when the times span less than a decade (runs
    // resumed from a warm-up checkpoint), else on a log axis (runs from the first steps).
    if t_lo.is_finite() && t_last / t_lo < 10.0 {
        let pad = (t_last - t_lo) * 0.05;
        time_chart(&left, (t_lo - pad)..(t_last + pad), "training seconds", y_range.clone(), runs, kind, &color)?;
    } else {
        time_chart(
            &left,
            (t_min.max(1e-4)..t_max).log_scale(),
            "training seconds (log scale)",
            y_range.clone(),
            runs,
            kind,
            &color,
        )?;
    }
    // Right: against epochs.
    epoch_chart(&right, epochs, y_range, label, runs, &color)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The right panel: the metric (`y_desc`) against epochs, one line per run.
fn epoch_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    epochs: std::ops::Range<f64>,
    y_range: std::ops::Range<f64>,
    y_desc: &str,
    runs: &[Run],
    color: &dyn Fn(&Run) -> RGBAColor,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| DrawError(e.to_string());
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(epochs, y_range)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("epochs")
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    for r in runs {
        let c = color(r);
        let pts: Vec<(f64, f64)> = r.curve.iter().map(|p| (p.1, p.2)).collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))).map_err(err)?;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
    }
    Ok(())
}

/// The left panel: the kind's metric against training seconds on axis `x`, one line per run.
fn time_chart<DB: DrawingBackend, X>(
    area: &DrawingArea<DB, Shift>,
    x: X,
    x_desc: &str,
    y_range: std::ops::Range<f64>,
    runs: &[Run],
    kind: Kind,
    color: &dyn Fn(&Run) -> RGBAColor,
) -> DrawResult
where
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| DrawError(e.to_string());
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y_range)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels(12)
        .x_label_formatter(&|x| seconds_label(*x))
        .x_desc(x_desc)
        .y_desc(kind.metric_label())
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    let mut labelled = Vec::new();
    for r in runs {
        let c = color(r);
        let pts: Vec<(f64, f64)> = r.curve.iter().filter(|p| p.0 > 0.0).map(|p| (p.0, p.2)).collect();
        let series = chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))).map_err(err)?;
        if !labelled.contains(&r.method) {
            labelled.push(r.method.clone());
            series
                .label(r.method.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(match kind {
            Kind::Classifier => SeriesLabelPosition::UpperLeft,
            Kind::SkipGram => SeriesLabelPosition::UpperRight,
        })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    Ok(())
}
