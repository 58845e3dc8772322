//! The run as a picture, SVG written by hand: throughput (answers and admissions per second) over
//! latency percentiles (p50, p99, max per second).

use super::report::Report;
use std::fmt::Write;

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN: f64 = 60.0;

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    values: Vec<f64>,
}

pub fn render(report: &Report) -> String {
    // The last second is usually partial (the run ends mid-second); drawn, it looks like a collapse.
    let whole = (report.duration_s.floor() as usize).max(2).min(report.timeline.len());
    let t = &report.timeline[..whole];
    let throughput = [
        Series { name: "answers/s", color: "#1f77b4", values: t.iter().map(|s| s.requests as f64).collect() },
        Series { name: "admitted/s", color: "#2ca02c", values: t.iter().map(|s| s.admitted as f64).collect() },
    ];
    let latency = [
        Series { name: "p50 ms", color: "#2ca02c", values: t.iter().map(|s| s.p50_ms).collect() },
        Series { name: "p99 ms", color: "#ff7f0e", values: t.iter().map(|s| s.p99_ms).collect() },
        Series { name: "max ms", color: "#d62728", values: t.iter().map(|s| s.max_ms).collect() },
    ];
    let height = 2.0 * (PANEL_HEIGHT + MARGIN) + MARGIN;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    svg.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!(
        "seatrush-lab bench: {} loop, {} connections{} - {:.0} req/s, {:.0} admitted/s, p99 {:.2} ms",
        report.mode,
        report.connections,
        report.rate_target.map(|r| format!(" at {r:.0} req/s")).unwrap_or_default(),
        report.requests_per_s,
        report.admitted_per_s,
        report.latency_ms.p99
    );
    let _ = write!(svg, r#"<text x="{MARGIN}" y="24" font-size="14">{}</text>"#, escape(&title));
    panel(&mut svg, MARGIN, "per second", &throughput);
    panel(&mut svg, 2.0 * MARGIN + PANEL_HEIGHT, "latency (ms, per second)", &latency);
    svg.push_str("</svg>\n");
    svg
}

fn panel(svg: &mut String, top: f64, label: &str, series: &[Series]) {
    let (left, width) = (MARGIN, WIDTH - 2.0 * MARGIN);
    let n = series.iter().map(|s| s.values.len()).max().unwrap_or(0).max(2);
    let y_max = series.iter().flat_map(|s| s.values.iter().copied()).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let x = |i: usize| left + width * i as f64 / (n - 1) as f64;
    let y = |v: f64| top + PANEL_HEIGHT - PANEL_HEIGHT * v / y_max;
    let _ = write!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{width}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##
    );
    for step in 0..=4 {
        let v = y_max * step as f64 / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + width,
            left - 4.0,
            y(v) + 4.0,
            short(v),
            y = y(v)
        );
    }
    let _ = write!(svg, r#"<text x="{left}" y="{}">{}</text>"#, top - 6.0, escape(label));
    let _ =
        write!(svg, r#"<text x="{}" y="{}" text-anchor="end">seconds</text>"#, left + width, top + PANEL_HEIGHT + 16.0);
    for (k, s) in series.iter().enumerate() {
        let points: Vec<String> =
            s.values.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.color,
            points.join(" ")
        );
        let lx = left + 10.0 + 110.0 * k as f64;
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            top + 8.0,
            s.color,
            lx + 14.0,
            top + 17.0,
            s.name
        );
    }
}

fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
