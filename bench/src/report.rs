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
    /// Every figure printed so far, for the table: name, value, unit and
    /// target (empty when the figure has none).
    rows: Vec<(String, String, String, String)>,
}

/// The 1-minute load average, printed beside every figure: on a shared box
/// it says how much to trust a latency (CPU per operation and ratios to a
/// floor or ceiling of the same run move much less).
pub fn load1() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A figure's target as the table shows it, from its `target_max` or
/// `target_min` note.
fn target_of(extra: &Value) -> String {
    match (extra.get("target_max"), extra.get("target_min")) {
        (Some(v), _) => format!("<= {v}"),
        (None, Some(v)) => format!(">= {v}"),
        _ => String::new(),
    }
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
        if let Some(load) = load1() {
            out.insert("load1".into(), json!(load));
        }
        println!("{}", Value::Object(out));
    }

    /// One scalar figure, with an optional note (e.g. what it was measured
    /// against).
    pub fn figure(&mut self, name: &str, value: f64, unit: &str, extra: Value) {
        let mut line = Map::new();
        line.insert("figure".into(), json!(name));
        line.insert("value".into(), json!(round3(value)));
        line.insert("unit".into(), json!(unit));
        let target = target_of(&extra);
        if let Value::Object(m) = extra {
            line.extend(m);
        }
        self.emit(line);
        self.rows
            .push((name.to_string(), fmt_num(value), unit.to_string(), target));
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
        let target = target_of(&extra);
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
            target,
        ));
    }

    /// Counts of kinds of one thing (e.g. answers by status), as one line
    /// and one row: `200=16 429=184`.
    pub fn counts(&mut self, name: &str, counts: &[(&str, u64)], unit: &str, extra: Value) {
        let mut line = Map::new();
        line.insert("figure".into(), json!(name));
        line.insert("unit".into(), json!(unit));
        for (kind, n) in counts {
            line.insert((*kind).into(), json!(n));
        }
        if let Value::Object(m) = extra {
            line.extend(m);
        }
        self.emit(line);
        let row: Vec<String> = counts.iter().map(|(k, n)| format!("{k}={n}")).collect();
        let row = (
            name.to_string(),
            row.join(" "),
            unit.to_string(),
            String::new(),
        );
        self.rows.push(row);
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
        match load1() {
            Some(load) => println!("{} results (load average {load})", self.scenario),
            None => println!("{} results", self.scenario),
        }
        println!("{:<w0$}  {:>w1$}  {:<5}  target", "figure", "value", "unit");
        println!("{:-<w0$}  {:->w1$}  -----  ------", "", "");
        for (name, value, unit, target) in &self.rows {
            println!("{name:<w0$}  {value:>w1$}  {unit:<5}  {target}");
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
