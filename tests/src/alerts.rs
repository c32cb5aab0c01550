//! The alert rules the repository ships (`contrib/prometheus/tsoracle-alerts.yml`) evaluated on
//! what a real exporter read: scrapes of a real cluster in the state an alert is for
//! ([`Recording`]), laid on `promtool test rules`' clock one scrape a minute, and the alerts
//! that fire at the end compared with those a test expects ([`Recording::assert_firing`]).
//!
//! The hand-written series of `contrib/prometheus/tsoracle-alerts.test.yml` say what each rule
//! does with the values it was written for; a recording says what it does with the values a
//! cluster in that state really exports (a label an exporter adds, a series that is missing
//! rather than 0, `pg_up` when the exporter cannot log in).
//!
//! Every sample of every scrape is a series of the test (labelled `instance` and `job` as a
//! Prometheus server would label its target); a series missing from a scrape is `_` there
//! (no sample), as a stale series is. The alerts firing at the last minute are read back with
//! a `promql_expr_test` of `count by (alertname) (ALERTS{alertstate="firing"})`, so a test
//! states the whole set: an alert that should not fire, and fires, fails it as well.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::time::Duration;

use crate::error::HarnessError;
use crate::exporter::{promtool, Metrics, ALERT_RULES};
use crate::Result;

/// The `instance` label the recorded series get (a Prometheus target's).
pub const INSTANCE: &str = "recorded:9187";
/// The `job` label the recorded series get.
pub const JOB: &str = "tsoracle";

/// Scrapes of one exporter, in order; each stands for `minutes_each` minutes of
/// promtool's clock.
#[derive(Clone, Debug)]
pub struct Recording {
    scrapes: Vec<Metrics>,
    minutes_each: usize,
}

impl Recording {
    /// An empty recording whose scrapes each hold for `minutes_each` minutes (at least 1):
    /// a rule's `for:` is reached by holding what was read, not by waiting for it here.
    pub fn new(minutes_each: usize) -> Recording {
        Recording { scrapes: Vec::new(), minutes_each: minutes_each.max(1) }
    }

    /// Append a scrape.
    pub fn push(&mut self, m: Metrics) {
        self.scrapes.push(m);
    }

    /// How many minutes of promtool's clock the recording covers.
    pub fn minutes(&self) -> usize {
        self.scrapes.len() * self.minutes_each
    }

    /// The `input_series` of the recording, in promtool's YAML.
    pub fn input_series(&self) -> String {
        // Series key (name and labels, as promtool reads them) → its value in each scrape.
        let mut series: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
        for (i, m) in self.scrapes.iter().enumerate() {
            for s in &m.samples {
                let mut labels = s.labels.clone();
                labels.insert("instance".into(), INSTANCE.into());
                labels.insert("job".into(), JOB.into());
                let key = series_key(&s.name, &labels);
                series.entry(key).or_insert_with(|| vec![None; self.scrapes.len()])[i] =
                    Some(s.value);
            }
        }
        let mut out = String::new();
        for (key, values) in series {
            let mut v = Vec::with_capacity(self.minutes());
            for value in values {
                for _ in 0..self.minutes_each {
                    v.push(value.map_or_else(|| "_".to_string(), format_value));
                }
            }
            // YAML single quotes: a quote is doubled.
            let _ = writeln!(out, "      - series: '{}'", key.replace('\'', "''"));
            let _ = writeln!(out, "        values: '{}'", v.join(" "));
        }
        out
    }

    /// Assert that at the recording's last minute exactly the alerts `expected` fire, each for
    /// one series (the recording is one server's): runs `promtool test rules` on the shipped
    /// rules with the recorded series.
    #[track_caller]
    pub fn assert_firing(&self, expected: &[&str]) {
        if let Err(e) = self.check_firing(expected) {
            panic!("{e}");
        }
    }

    /// [`Recording::assert_firing`], as a result.
    pub fn check_firing(&self, expected: &[&str]) -> Result<()> {
        if self.scrapes.is_empty() {
            return Err(HarnessError::Other("an empty recording fires nothing".into()));
        }
        let expected: BTreeSet<&str> = expected.iter().copied().collect();
        let mut samples = String::new();
        if expected.is_empty() {
            samples.push_str("        exp_samples: []\n");
        } else {
            samples.push_str("        exp_samples:\n");
            for name in &expected {
                let _ = writeln!(samples, "          - labels: '{{alertname=\"{name}\"}}'");
                samples.push_str("            value: 1\n");
            }
        }
        let test = format!(
            "rule_files:\n  - {ALERT_RULES}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{}    promql_expr_test:\n      - expr: count by (alertname) (ALERTS{{alertstate=\"firing\"}})\n        eval_time: {}m\n{samples}",
            self.input_series(),
            self.minutes() - 1,
        );
        let dir = tempdir()?;
        let path = dir.join("recorded.test.yml");
        fs::write(&path, &test)
            .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
        let out = promtool(&["test", "rules", &path.to_string_lossy()]);
        let _ = fs::remove_dir_all(&dir);
        let why = match out {
            Ok(out) if out.contains("SUCCESS") => return Ok(()),
            Ok(out) => out,
            Err(e) => e.to_string(),
        };
        Err(HarnessError::Other(format!(
            "on the recorded series, the alerts firing are not exactly {expected:?}:\n{why}\n--- the test file ---\n{test}"
        )))
    }
}

/// `name{a="x",b="y"}` with the label values escaped as PromQL strings.
fn series_key(name: &str, labels: &BTreeMap<String, String>) -> String {
    let body: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{name}{{{}}}", body.join(","))
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A fresh directory for one promtool run.
fn tempdir() -> Result<std::path::PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let dir = base.join(format!("tso-alerts-{}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(HarnessError::io(format!("create {}", dir.display()), e)),
        }
    }
    Err(HarnessError::Other("could not create a directory for promtool".into()))
}

/// Scrape `exporter` `n` times, `gap` apart, into a recording whose scrapes each hold for
/// `minutes_each` minutes.
pub fn record(
    exporter: &crate::exporter::Exporter,
    n: usize,
    gap: Duration,
    minutes_each: usize,
) -> Result<Recording> {
    let mut r = Recording::new(minutes_each);
    for i in 0..n {
        if i > 0 {
            std::thread::sleep(gap);
        }
        r.push(exporter.scrape()?);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(text: &str) -> Metrics {
        Metrics::parse(text).unwrap()
    }

    #[test]
    fn a_recording_becomes_promtool_series() {
        let mut r = Recording::new(2);
        r.push(scrape("pg_up 1\ntsoracle_serving{server=\"a:1\"} 1\n"));
        r.push(scrape("pg_up 0\n"));
        assert_eq!(r.minutes(), 4);
        assert_eq!(
            r.input_series(),
            "      - series: 'pg_up{instance=\"recorded:9187\",job=\"tsoracle\"}'\n        values: '1 1 0 0'\n      - series: 'tsoracle_serving{instance=\"recorded:9187\",job=\"tsoracle\",server=\"a:1\"}'\n        values: '1 1 _ _'\n"
        );
    }

    #[test]
    fn label_values_are_escaped_for_promql_and_yaml() {
        let mut r = Recording::new(1);
        r.push(scrape("x{detail=\"it's \\\"q\\\"\"} 1\n"));
        assert!(
            r.input_series().contains(r#"x{detail="it''s \"q\"",instance="#),
            "{}",
            r.input_series()
        );
    }
}
