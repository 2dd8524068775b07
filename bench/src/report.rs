//! Figures: each printed as one JSON line on stdout when measured, and all
//! of a run as a readable table at the end.

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

/// Latencies are recorded in microseconds, up to 10 minutes.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("static bounds are valid")
}

/// The figures of one scenario run.
pub struct Report {
    /// Scenario name, the first field of every line.
    scenario: &'static str,
    /// Every figure printed so far, for the table.
    rows: Vec<(String, String, String)>,
}

impl Report {
    /// An empty report for `scenario`.
    pub fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            rows: Vec::new(),
        }
    }

    fn emit(&self, mut line: Map<String, Value>) {
        line.insert("scenario".into(), json!(self.scenario));
        // serde_json's map keeps keys sorted; put the scenario first by hand.
        let scenario = line.remove("scenario").unwrap_or_default();
        let mut out = Map::new();
        out.insert("scenario".into(), scenario);
        out.extend(line);
        println!("{}", Value::Object(out));
    }

    /// One scalar figure, with an optional note (e.g. what it was measured
    /// against).
    pub fn figure(&mut self, name: &str, value: f64, unit: &str, extra: Value) {
        let mut line = Map::new();
        line.insert("figure".into(), json!(name));
        line.insert("value".into(), json!(round3(value)));
        line.insert("unit".into(), json!(unit));
        if let Value::Object(m) = extra {
            line.extend(m);
        }
        self.emit(line);
        self.rows
            .push((name.to_string(), fmt_num(value), unit.to_string()));
    }

    /// A latency distribution in ms: count, p50, p90, p99, p99.9, max.
    pub fn latency(&mut self, name: &str, h: &Histogram<u64>, extra: Value) {
        let ms = |us: u64| round3(us as f64 / 1000.0);
        let mut line = Map::new();
        line.insert("figure".into(), json!(name));
        line.insert("unit".into(), json!("ms"));
        line.insert("count".into(), json!(h.len()));
        line.insert("p50".into(), json!(ms(h.value_at_quantile(0.5))));
        line.insert("p90".into(), json!(ms(h.value_at_quantile(0.9))));
        line.insert("p99".into(), json!(ms(h.value_at_quantile(0.99))));
        line.insert("p999".into(), json!(ms(h.value_at_quantile(0.999))));
        line.insert("max".into(), json!(ms(h.max())));
        if let Value::Object(m) = extra {
            line.extend(m);
        }
        self.emit(line);
        self.rows.push((
            name.to_string(),
            format!(
                "n={} p50={} p99={} p99.9={} max={}",
                h.len(),
                ms(h.value_at_quantile(0.5)),
                ms(h.value_at_quantile(0.99)),
                ms(h.value_at_quantile(0.999)),
                ms(h.max())
            ),
            "ms".to_string(),
        ));
    }

    /// The readable table of everything measured.
    pub fn print_table(&self) {
        let w0 = self
            .rows
            .iter()
            .map(|r| r.0.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let w1 = self
            .rows
            .iter()
            .map(|r| r.1.len())
            .max()
            .unwrap_or(5)
            .max(5);
        println!();
        println!("{} results", self.scenario);
        println!("{:<w0$}  {:>w1$}  unit", "figure", "value");
        println!("{:-<w0$}  {:->w1$}  ----", "", "");
        for (name, value, unit) in &self.rows {
            println!("{name:<w0$}  {value:>w1$}  {unit}");
        }
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}
