//! SVG plots (plotters): latency percentile distributions and server RSS
//! against connections.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

/// Deepest percentile plotted, in "nines" (4 = 99.99 %).
const MAX_NINES: f64 = 4.0;

fn nines_label(x: &f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    if *x < 0.5 {
        "0%".to_string()
    } else {
        format!("{p}%")
    }
}

/// Latency (ms) against percentile, one line per histogram (µs), with the
/// percentile axis stretched so that the tail is visible.
pub fn latency(path: &Path, title: &str, series: &[(&str, &Histogram<u64>)]) -> anyhow::Result<()> {
    let mut lines = Vec::new();
    let mut ymax: f64 = 0.001;
    for (name, h) in series {
        if h.is_empty() {
            continue;
        }
        // No deeper than the samples support.
        let deepest = (h.len() as f64).log10().min(MAX_NINES);
        let pts: Vec<(f64, f64)> = (0..=200)
            .map(|i| deepest * i as f64 / 200.0)
            .map(|x| {
                let q = 1.0 - 10f64.powf(-x);
                (x, h.value_at_quantile(q) as f64 / 1000.0)
            })
            .collect();
        ymax = ymax.max(h.max() as f64 / 1000.0);
        lines.push((name.to_string(), pts));
    }
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..MAX_NINES, 0f64..ymax * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_labels(5)
        .x_label_formatter(&nines_label)
        .draw()?;
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Server RSS (MiB) against open connections.
pub fn rss(path: &Path, title: &str, samples: &[(usize, u64)]) -> anyhow::Result<()> {
    let xmax = samples.iter().map(|s| s.0).max().unwrap_or(1).max(1) as f64;
    let ymax = samples.iter().map(|s| s.1).max().unwrap_or(1) as f64 / 1048576.0;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax * 1.02, 0f64..ymax.max(1.0) * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("open connections")
        .y_desc("server RSS (MiB)")
        .draw()?;
    let pts = samples
        .iter()
        .map(|&(n, rss)| (n as f64, rss as f64 / 1048576.0));
    chart.draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))?;
    chart.draw_series(pts.map(|p| Circle::new(p, 2, BLUE.filled())))?;
    root.present()?;
    Ok(())
}
