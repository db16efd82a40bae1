//! The trials of a search and their file, `trials.csv`: one row per trial, rewritten after
//! each, so that an interrupted search resumes from it.

use super::recipe::Setting;
use crate::{Error, io_err};
use std::fmt::Write as _;
use std::path::Path;

/// Why a trial ended where it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Its rung has not finished yet.
    Pending,
    /// Among the best of its rung: trained again with more epochs or data.
    Promoted,
    /// Below the best of its rung: stopped there (successive halving).
    Halved,
    /// Trained with the full epochs or data.
    Finished,
    /// The search's time ran out during it (its figure is of a shortened run).
    Budget,
    /// Training failed (a diverged run, a refused setting); no figure.
    Failed,
}

impl Stop {
    /// The word in `trials.csv`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Pending => "pending",
            Stop::Promoted => "promoted",
            Stop::Halved => "halved",
            Stop::Finished => "finished",
            Stop::Budget => "budget",
            Stop::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Stop::Pending, Stop::Promoted, Stop::Halved, Stop::Finished, Stop::Budget, Stop::Failed]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// One trial: a setting of the space trained with some epochs or data.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// The setting's number (its trials at every rung share it).
    pub id: usize,
    /// The rung of successive halving (0: least epochs or data).
    pub rung: usize,
    /// Epochs (networks) or fraction of the training rows (linear solvers) it trained with.
    pub resource: f64,
    /// Its settings (`--set` style); empty for the base config itself.
    pub settings: Vec<Setting>,
    /// The validation metric (`None` when training failed).
    pub metric: Option<f64>,
    /// Seconds the trial took (loading, training and validation).
    pub seconds: f64,
    /// Seconds of the search when it ended.
    pub elapsed: f64,
    /// Why it ended there.
    pub stop: Stop,
    /// Where it started ([`Start`]): `scratch`, `continues <id>-r<rung>` (a network run of
    /// the rung below, continued) or `from <id>-r<rung>` (that trial's linear model).
    pub start: String,
}

/// Where a trial starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From the config's own initialisation.
    Scratch,
    /// Continuing the network run of trial `(id, rung)`.
    Continues(usize, usize),
    /// From the linear model of trial `(id, rung)`.
    From(usize, usize),
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Start::Scratch => write!(f, "scratch"),
            Start::Continues(id, rung) => write!(f, "continues {id}-r{rung}"),
            Start::From(id, rung) => write!(f, "from {id}-r{rung}"),
        }
    }
}

/// The header of `trials.csv`.
const HEADER: &str = "id,rung,resource,metric,seconds,elapsed,stop,start,settings";
/// The header of files written before trials recorded their start (read with an empty start).
const HEADER_NO_START: &str = "id,rung,resource,metric,seconds,elapsed,stop,settings";

impl Trial {
    /// Settings as one CSV field: `key=value` pairs joined by `; `, quoted.
    pub fn settings_text(&self) -> String {
        if self.settings.is_empty() {
            return "(base config)".into();
        }
        self.settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    /// Whether it continued the network run of its rung below.
    pub fn continued(&self) -> bool {
        self.start.starts_with("continues")
    }
}

/// Writes `trials` to `path` (replacing it through a temporary file, so that a kill leaves the
/// old or the new file, never half of one).
pub fn write(path: &Path, trials: &[Trial]) -> Result<(), Error> {
    let mut text = format!("{HEADER}\n");
    for t in trials {
        let metric = t.metric.map_or(String::new(), |m| format!("{m:.6}"));
        let settings = t.settings_text().replace('"', "\"\"");
        let _ = writeln!(
            text,
            "{},{},{},{metric},{:.3},{:.3},{},{},\"{settings}\"",
            t.id,
            t.rung,
            t.resource,
            t.seconds,
            t.elapsed,
            t.stop.as_str(),
            t.start
        );
    }
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, text).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Reads a `trials.csv` written by [`write`]; an error names the line.
pub fn read(path: &Path) -> Result<Vec<Trial>, Error> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let bad = |n: usize, msg: &str| Error::DataMismatch { path: path.to_path_buf(), msg: format!("line {n}: {msg}") };
    let mut lines = text.lines().enumerate();
    let with_start = match lines.next() {
        Some((_, h)) if h == HEADER => true,
        Some((_, h)) if h == HEADER_NO_START => false,
        _ => return Err(bad(1, &format!("expected the header `{HEADER}`: not a farout tune trials file"))),
    };
    let mut trials = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let (fields, settings) = line.split_once(",\"").ok_or_else(|| bad(n, "no quoted settings field"))?;
        let mut f: Vec<&str> = fields.split(',').collect();
        if !with_start {
            f.push("");
        }
        let [id, rung, resource, metric, seconds, elapsed, stop, start] = f.as_slice() else {
            return Err(bad(n, &format!("expected {} fields", if with_start { 9 } else { 8 })));
        };
        let num = |s: &str, what: &str| s.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| bad(n, what));
        let settings = settings.strip_suffix('"').ok_or_else(|| bad(n, "unterminated settings field"))?;
        let settings = settings.replace("\"\"", "\"");
        trials.push(Trial {
            id: id.parse().map_err(|_| bad(n, "id is not an integer"))?,
            rung: rung.parse().map_err(|_| bad(n, "rung is not an integer"))?,
            resource: num(resource, "resource is not a number")?,
            metric: if metric.is_empty() { None } else { Some(num(metric, "metric is not a finite number")?) },
            seconds: num(seconds, "seconds is not a number")?,
            elapsed: num(elapsed, "elapsed is not a number")?,
            stop: Stop::parse(stop).ok_or_else(|| bad(n, "unknown stop reason"))?,
            start: start.to_string(),
            settings: parse_settings(&settings),
        });
    }
    Ok(trials)
}

fn parse_settings(text: &str) -> Vec<Setting> {
    if text == "(base config)" {
        return Vec::new();
    }
    text.split("; ").filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The trials as a Markdown table, best metric first (`higher`: whether higher is better).
pub fn table(trials: &[Trial], metric: &str, unit: &str) -> String {
    let mut md = format!(
        "| id | rung | {unit} | {metric} | seconds | stop | start | settings |\n|---|---|---|---|---|---|---|---|\n"
    );
    for t in trials {
        let m = t.metric.map_or("-".into(), |m| format!("{m:.4}"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {m} | {:.1} | {} | {} | {} |",
            t.id,
            t.rung,
            format!("{:.3}", t.resource).trim_end_matches('0').trim_end_matches('.'),
            t.seconds,
            t.stop.as_str(),
            t.start,
            t.settings_text()
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_survive_the_round_trip_through_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trials.csv");
        let trials = vec![
            Trial {
                id: 0,
                rung: 1,
                resource: 0.333,
                settings: vec![],
                metric: Some(0.625),
                seconds: 1.5,
                elapsed: 2.0,
                stop: Stop::Promoted,
                start: "continues 0-r0".into(),
            },
            Trial {
                id: 3,
                rung: 0,
                resource: 2.0,
                settings: vec![("linear.init".into(), "\"msi\"".into()), ("linear.c".into(), "0.5".into())],
                metric: None,
                seconds: 0.25,
                elapsed: 3.0,
                stop: Stop::Failed,
                start: "scratch".into(),
            },
        ];
        write(&path, &trials).unwrap();
        assert_eq!(read(&path).unwrap(), trials);
    }

    #[test]
    fn a_foreign_file_is_refused_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trials.csv");
        std::fs::write(&path, format!("{HEADER}\n0,0,1,0.5,1,1,done,scratch,\"\"\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("stop"), "{e}");
    }

    #[test]
    fn a_file_written_before_trials_recorded_their_start_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trials.csv");
        std::fs::write(&path, format!("{HEADER_NO_START}\n2,1,0.333,0.5,1,4,promoted,\"linear.c=0.5\"\n")).unwrap();
        let t = read(&path).unwrap();
        assert_eq!((t[0].id, t[0].rung, t[0].stop, t[0].start.as_str()), (2, 1, Stop::Promoted, ""));
        assert_eq!(t[0].settings, vec![("linear.c".to_string(), "0.5".to_string())]);
    }
}
