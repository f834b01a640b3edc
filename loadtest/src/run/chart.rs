//! `--chart FILE.svg`: one bar per target for the scenario's main figure (the per-unit cost the
//! goals of issue 7 are stated in), drawn with plotters' SVG backend. Text is laid out by
//! plotters' estimate, so no font files are needed. Reads results only; measures nothing.

use std::path::Path;

use plotters::prelude::*;

use super::chaos::{ChaosReport, ChaosSample};
use super::soak::{SoakReport, SoakSample};
use super::TargetResult;

/// The figure a scenario's chart shows, its axis label, and how to read it from a result.
pub fn main_figure(scenario: &str) -> (&'static str, fn(&TargetResult) -> Option<f64>) {
    match scenario {
        "small-get" | "small-get-h2" | "reload-storm" => {
            ("CPU us per request (lower is better)", |r| {
                r.cpu_us_per_request
            })
        }
        "big-list" | "exec-stream" | "portforward-stream" => {
            ("CPU ms per MB (lower is better)", |r| r.cpu_ms_per_mb)
        }
        "watch-idle" => ("KiB of memory per open watch (lower is better)", |r| {
            r.kib_per_watch
        }),
        "watch-events" => ("event latency p99, us (lower is better)", |r| r.p99_us),
        "watch-latency" => (
            "added event latency p50 against direct, us (lower is better)",
            |r| r.p50_us,
        ),
        "watch-fanout" => ("CPU us per delivered event (lower is better)", |r| {
            r.cpu_us_per_event
        }),
        "fleet-list" => (
            "CPU us per object: the target's, or the members' for direct (lower is better)",
            |r| r.cpu_us_per_object.or(r.upstream_cpu_us_per_object),
        ),
        _ => ("requests per second", |r| r.req_per_sec),
    }
}

/// Draws the chart. Targets without the figure (no `--pid`) get no bar but keep their slot.
pub fn write_svg(path: &Path, scenario: &str, results: &[TargetResult]) -> anyhow::Result<()> {
    let (label, figure) = main_figure(scenario);
    let values: Vec<(String, f64)> = results
        .iter()
        .map(|r| (r.target.clone(), figure(r).unwrap_or(0.0)))
        .collect();
    let max = values.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
    let top = if max > 0.0 { max * 1.15 } else { 1.0 };
    let width = (160 + 110 * values.len().max(1)) as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = values.len().max(1) as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("fleetgate-loadtest: {scenario}"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0..n, 0.0..top)?;
    let names: Vec<String> = values.iter().map(|(n, _)| n.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(label)
        .x_labels(values.len().max(1))
        .x_label_formatter(&|i| names.get(*i as usize).cloned().unwrap_or_default())
        .draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, (name, v))| {
        let colour = if name.starts_with("fleetgate") {
            RGBColor(0x1f, 0x77, 0xb4)
        } else {
            RGBColor(0x99, 0x99, 0x99)
        };
        let mut bar = Rectangle::new([(i as i32, 0.0), (i as i32 + 1, *v)], colour.filled());
        bar.set_margin(0, 0, 12, 12);
        bar
    }))?;
    chart.draw_series(values.iter().enumerate().map(|(i, (_, v))| {
        Text::new(
            format!("{v:.1}"),
            (i as i32, *v + top * 0.02),
            ("sans-serif", 14).into_font(),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// A line of a timeline panel: its name, colour, and its value in a sample.
type Series<T> = (&'static str, RGBColor, fn(&T) -> Option<f64>);

/// One panel of a timeline: its axis label, and its series drawn as lines, or as bars (one
/// per sample, at its time) when `bars` is set.
struct Panel<T> {
    label: &'static str,
    series: Vec<Series<T>>,
    bars: bool,
}

/// A panel of lines.
fn lines<T>(label: &'static str, series: Vec<Series<T>>) -> Panel<T> {
    Panel {
        label,
        series,
        bars: false,
    }
}

/// The gateway's resident memory and open descriptors, a panel each, from each sample's.
fn process_panels<T>(rss_mib: fn(&T) -> Option<f64>, fds: fn(&T) -> Option<f64>) -> [Panel<T>; 2] {
    [
        lines("resident memory, MiB", vec![("gateway RSS", BLUE, rss_mib)]),
        lines("open file descriptors", vec![("gateway fds", BLUE, fds)]),
    ]
}

/// Draws panels sharing a time axis (minutes), a red line across all of them at each of `marks`
/// (seconds).
fn draw_timeline<T>(
    path: &Path,
    title: &str,
    samples: &[T],
    at_s: fn(&T) -> f64,
    marks: &[f64],
    panels: Vec<Panel<T>>,
) -> anyhow::Result<()> {
    let minutes = |s: f64| s / 60.0;
    let end = samples
        .last()
        .map(|s| minutes(at_s(s)))
        .unwrap_or(1.0)
        .max(0.1);
    let root = SVGBackend::new(path, (1000, 230 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let areas = root.split_evenly((panels.len(), 1));
    for (area, panel) in areas.iter().zip(panels) {
        let max = samples
            .iter()
            .flat_map(|s| panel.series.iter().filter_map(move |(_, _, f)| f(s)))
            .fold(0.0_f64, f64::max);
        let top = if max > 0.0 { max * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .y_desc(panel.label)
            .light_line_style(WHITE)
            .draw()?;
        for &mark in marks {
            let x = minutes(mark);
            chart.draw_series(LineSeries::new([(x, 0.0), (x, top)], RED.stroke_width(1)))?;
        }
        for (name, color, f) in panel.series {
            let points = samples
                .iter()
                .filter_map(move |s| Some((minutes(at_s(s)), f(s)?)));
            if panel.bars {
                let bar = move |(x, h): (f64, f64)| {
                    Rectangle::new(
                        [(x - end / 400.0, 0.0), (x + end / 400.0, h)],
                        color.filled(),
                    )
                };
                chart
                    .draw_series(points.filter(|(_, h)| *h > 0.0).map(bar))?
                    .label(name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 4), (x + 12, y + 4)], color.filled())
                    });
            } else {
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// `soak`'s chart: its timeline in five panels sharing the time axis (resident memory, open
/// descriptors, latency p99 by kind, errors per sample split into those the restarts explain and
/// the rest, open watches), each member restart a red line across all of them.
pub fn write_soak_svg(path: &Path, target: &str, report: &SoakReport) -> anyhow::Result<()> {
    let [rss, fds] = process_panels::<SoakSample>(|s| s.rss_mib, |s| s.fds.map(|f| f as f64));
    let panels = vec![
        rss,
        fds,
        lines(
            "latency p99, ms",
            vec![
                ("GET", BLUE, |s| s.get_p99_ms),
                ("list", GREEN, |s| s.list_p99_ms),
                ("exec", MAGENTA, |s| s.exec_p99_ms),
            ],
        ),
        Panel {
            label: "errors per sample",
            series: vec![
                ("near a restart", RGBColor(255, 160, 0), |s| {
                    Some(s.errors_restart as f64)
                }),
                ("elsewhere", RED, |s| Some(s.errors_other as f64)),
            ],
            bars: true,
        },
        lines(
            "open watches",
            vec![("watches", BLUE, |s| Some(s.watches_open as f64))],
        ),
    ];
    let marks: Vec<f64> = report.restarts.iter().map(|r| r.down_s).collect();
    draw_timeline(
        path,
        &format!("fleetgate-loadtest soak: {target} (red: a member restart)"),
        &report.samples,
        |s| s.at_s,
        &marks,
        panels,
    )
}

/// `chaos`' chart: the gateway's resident memory and descriptors, the event delivery latency,
/// events and open watches per sample, each fault a red line across them.
pub fn write_chaos_svg(path: &Path, report: &ChaosReport) -> anyhow::Result<()> {
    let [rss, fds] = process_panels::<ChaosSample>(|s| s.rss_mib, |s| s.fds.map(|f| f as f64));
    let panels = vec![
        rss,
        fds,
        lines(
            "event latency, ms",
            vec![
                ("p50", GREEN, |s| s.event_p50_ms),
                ("p99", BLUE, |s| s.event_p99_ms),
            ],
        ),
        lines(
            "events and open watches",
            vec![
                ("events", GREEN, |s| Some(s.events as f64)),
                ("watches", BLUE, |s| Some(s.watches_open as f64)),
            ],
        ),
    ];
    let marks: Vec<f64> = report.faults.iter().map(|f| f.start_s).collect();
    draw_timeline(
        path,
        &format!(
            "fleetgate-loadtest chaos: seed {}, {} violations (red: a fault)",
            report.seed,
            report.accounting.violations_total()
        ),
        &report.samples,
        |s| s.at_s,
        &marks,
        panels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_bar_per_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.svg");
        let results = vec![
            TargetResult {
                target: "haproxy".into(),
                cpu_us_per_request: Some(30.0),
                ..Default::default()
            },
            TargetResult {
                target: "fleetgate".into(),
                cpu_us_per_request: Some(25.0),
                ..Default::default()
            },
        ];
        write_svg(&path, "small-get", &results).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("haproxy") && svg.contains("fleetgate"));
        assert!(svg.contains("30.0") && svg.contains("25.0"));
    }
}
