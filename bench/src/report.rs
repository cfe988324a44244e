//! The report as a terminal table, CSV files and an SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use plotters::prelude::*;
use smallgemm::Dtype;

use crate::competitor::Competitor;
use crate::stats::{geometric_mean, Summary};
use crate::suite::{Figure, Regime, Report, Shape};

/// The columns of the figures CSV, in order.
pub const CSV_COLUMNS: [&str; 23] = [
    "dtype",
    "regime",
    "threads",
    "m",
    "n",
    "k",
    "batch",
    "competitor",
    "alpha",
    "beta",
    "samples",
    "median_s",
    "gflops",
    "gflops_lo",
    "gflops_hi",
    "bound_gflops",
    "bound_limit",
    "fraction_of_bound",
    "ratio_smallgemm_over",
    "ratio_lo",
    "ratio_hi",
    "flops",
    "bytes",
];

type BlockKey = (Dtype, Regime, usize);
/// A table's rows: each shape with its figures.
type Rows<'a> = Vec<(Shape, Vec<&'a Figure>)>;

fn dtype_order(d: Dtype) -> usize {
    match d {
        Dtype::F64 => 0,
        Dtype::F32 => 1,
        _ => 2,
    }
}

/// The figures grouped by (dtype, regime, threads), then shape, in measurement order.
fn blocks(report: &Report) -> Vec<(BlockKey, Rows<'_>)> {
    let mut out: Vec<(BlockKey, Rows)> = Vec::new();
    for f in &report.figures {
        let key = (f.dtype, f.regime, f.threads);
        let pos = match out.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                out.push((key, Vec::new()));
                out.len() - 1
            }
        };
        let rows = &mut out[pos].1;
        match rows.iter_mut().find(|(s, _)| *s == f.shape) {
            Some((_, v)) => v.push(f),
            None => rows.push((f.shape, vec![f])),
        }
    }
    out.sort_by_key(|((d, r, t), _)| (dtype_order(*d), *r == Regime::Stream, *t));
    out
}

fn competitors_in(rows: &[(Shape, Vec<&Figure>)]) -> Vec<Competitor> {
    let mut v: Vec<Competitor> = rows
        .iter()
        .flat_map(|(_, fs)| fs.iter().map(|f| f.competitor))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn ci(s: &Summary) -> String {
    format!("{:.2} [{:.2}, {:.2}]", s.median, s.lo, s.hi)
}

/// The terminal report: versions, limits, JIT latency, one table per (dtype, regime,
/// threads) with every figure beside its bound and smallgemm's ratio to each competitor.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "smallgemm bench — ISA {}, alpha = {}, beta = {}; GFLOP/s with flops = 2mnk; medians [95% bootstrap CI]",
        report.isa.name(),
        report.alpha,
        report.beta
    );
    for (_, v) in &report.versions {
        let _ = writeln!(out, "  {v}");
    }
    let _ = writeln!(out, "\nLimits (measured in this run; all threads together)");
    let _ = writeln!(
        out,
        "{:>7}  {:<26} {:<26} {:<26} {:<26} {:<26} {:<26}",
        "threads",
        "FMA peak f64 GFLOP/s",
        "FMA peak f32 GFLOP/s",
        "L2 gemm-pattern GB/s",
        "DRAM gemm-pattern GB/s",
        "DRAM copy GB/s",
        "DRAM triad GB/s"
    );
    for l in &report.limits {
        let dram = |i: usize| l.dram.get(i).map_or("-".to_string(), |(_, s)| ci(s));
        let _ = writeln!(
            out,
            "{:>7}  {:<26} {:<26} {:<26} {:<26} {:<26} {:<26}",
            l.threads,
            ci(&l.peak_f64),
            ci(&l.peak_f32),
            ci(&l.l2),
            dram(0),
            dram(1),
            dram(2)
        );
    }
    let _ = writeln!(
        out,
        "Bounds: hot = min(FMA peak, flops / (bytes / L2 gemm-pattern bandwidth)); stream = min(FMA peak, flops / (bytes / DRAM gemm-pattern bandwidth)),\n\
         the FMA loop and the pattern over each case's own A, B and C timed in the same rounds as the figures (the table above: at the start);\n\
         bytes = A, B, C read once (C not when beta = 0) and C written once. Hot batch: {} KiB per thread; stream: {} MiB.",
        report.hot_bytes >> 10,
        report.stream_bytes >> 20
    );

    if let Some(lat) = &report.latency {
        latency_table(&mut out, report, lat);
    }

    for ((dtype, regime, threads), rows) in blocks(report) {
        let comps = competitors_in(&rows);
        let others: Vec<Competitor> = comps
            .iter()
            .copied()
            .filter(|c| *c != Competitor::Smallgemm)
            .collect();
        let _ = writeln!(
            out,
            "\n== {} · {} · {} thread{} — GFLOP/s; smallgemm [95% CI] and % of bound; others: GFLOP/s and smallgemm ÷ them",
            dtype.name(),
            match regime {
                Regime::Hot => "hot (batch in L2)",
                Regime::Stream => "streaming (from DRAM)",
            },
            threads,
            if threads == 1 { "" } else { "s" }
        );
        let mut header = format!(
            "{:<10} {:>8} {:>13} {:>24} {:>5}",
            "m x n x k", "batch", "bound", "smallgemm", "%bnd"
        );
        for c in &others {
            let _ = write!(header, "  {:>15}", c.name());
        }
        let _ = writeln!(out, "{header}");
        let mut ratios: BTreeMap<Competitor, Vec<f64>> = BTreeMap::new();
        let mut fractions = Vec::new();
        for (shape, figs) in &rows {
            let sg = figs.iter().find(|f| f.competitor == Competitor::Smallgemm);
            let any = figs[0];
            let mut line = format!(
                "{:<10} {:>8} {:>8.2} {:<4}",
                format!("{}x{}x{}", shape.0, shape.1, shape.2),
                any.batch,
                any.bound.gflops,
                match any.bound.limit {
                    "fma-peak" => "fma",
                    other => other,
                }
            );
            match sg {
                Some(f) => {
                    fractions.push(f.fraction_of_bound());
                    let _ = write!(
                        line,
                        " {:>24} {:>4.0}%",
                        ci(&f.gflops),
                        100.0 * f.fraction_of_bound()
                    );
                }
                None => {
                    let _ = write!(line, " {:>24} {:>5}", "-", "-");
                }
            }
            for c in &others {
                match figs.iter().find(|f| f.competitor == *c) {
                    Some(f) => {
                        let r = f.ratio.map(|r| r.median);
                        if let Some(r) = r {
                            ratios.entry(*c).or_default().push(r);
                        }
                        let _ = write!(
                            line,
                            "  {:>8.2} {:>5}",
                            f.gflops.median,
                            r.map_or("-".to_string(), |r| format!("{r:.2}x"))
                        );
                    }
                    None => {
                        let _ = write!(line, "  {:>15}", "-");
                    }
                }
            }
            let _ = writeln!(out, "{line}");
        }
        let mut summary = format!(
            "{:<10} {:>8} {:>13} {:>24} {:>5}",
            "geomean",
            "",
            "",
            "",
            geometric_mean(&fractions).map_or("-".into(), |g| format!("{:.0}%", 100.0 * g))
        );
        for c in &others {
            let g = ratios.get(c).and_then(|v| geometric_mean(v));
            let _ = write!(
                summary,
                "  {:>8} {:>5}",
                "",
                g.map_or("-".to_string(), |g| format!("{g:.2}x"))
            );
        }
        let _ = writeln!(out, "{summary}");
        let mut worst = format!("{:<10} {:>8} {:>13} {:>24} {:>5}", "min", "", "", "", "");
        for c in &others {
            let w = ratios
                .get(c)
                .and_then(|v| v.iter().copied().min_by(f64::total_cmp));
            let _ = write!(
                worst,
                "  {:>8} {:>5}",
                "",
                w.map_or("-".to_string(), |w| format!("{w:.2}x"))
            );
        }
        let _ = writeln!(out, "{worst}");
    }
    if !report.notes.is_empty() {
        let _ = writeln!(out, "\nNotes");
        for n in &report.notes {
            let _ = writeln!(out, "  {n}");
        }
    }
    out
}

fn latency_table(out: &mut String, report: &Report, lat: &crate::latency::LatencyReport) {
    let _ = writeln!(
        out,
        "\nJIT latency ({}): spec to callable kernel on a fresh Jit (cache miss) and a cache hit; medians [95% CI]",
        report.isa.name()
    );
    if let Some((spec, t)) = &lat.first_in_process {
        let _ = writeln!(
            out,
            "  first compile in the process: {} {:.1} µs (not among the samples below)",
            spec.name(),
            t * 1e6
        );
    }
    let _ = writeln!(
        out,
        "{:<14} {:>26} {:>12} {:>24} {:>24} {:>22} {:>22}",
        "spec",
        "miss µs",
        "compile µs",
        "hit ns",
        "libxsmm dispatch µs",
        "libxsmm hit ns",
        "mkl jit create µs"
    );
    let us = |s: &Summary| {
        format!(
            "{:.1} [{:.1}, {:.1}]",
            s.median * 1e6,
            s.lo * 1e6,
            s.hi * 1e6
        )
    };
    let ns = |s: &Summary| {
        format!(
            "{:.1} [{:.1}, {:.1}]",
            s.median * 1e9,
            s.lo * 1e9,
            s.hi * 1e9
        )
    };
    let opt =
        |s: &Option<Summary>, f: &dyn Fn(&Summary) -> String| s.as_ref().map_or("-".to_string(), f);
    for l in &lat.specs {
        let _ = writeln!(
            out,
            "{:<14} {:>26} {:>12.1} {:>24} {:>24} {:>22} {:>22}",
            format!(
                "{} {}x{}x{}",
                l.spec.dtype().name(),
                l.spec.m(),
                l.spec.n(),
                l.spec.k()
            ),
            us(&l.miss),
            l.compile_time.median * 1e6,
            ns(&l.hit),
            opt(&l.libxsmm_miss, &us),
            opt(&l.libxsmm_hit, &ns),
            opt(&l.mkl_create, &us)
        );
    }
    let miss: Vec<f64> = lat.specs.iter().map(|l| l.miss.median).collect();
    let hit: Vec<f64> = lat.specs.iter().map(|l| l.hit.median).collect();
    if let (Some(m), Some(h)) = (geometric_mean(&miss), geometric_mean(&hit)) {
        let _ = writeln!(
            out,
            "{:<14} {:>26} {:>12} {:>24}",
            "geomean",
            format!("{:.1}", m * 1e6),
            "",
            format!("{:.1}", h * 1e9)
        );
    }
}

fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

/// The figures as CSV, one row per figure, columns [`CSV_COLUMNS`].
pub fn csv(report: &Report) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for f in &report.figures {
        let (rl, rm, rh) = f
            .ratio
            .map_or((String::new(), String::new(), String::new()), |r| {
                (num(r.lo), num(r.median), num(r.hi))
            });
        let median_s = crate::stats::median(&f.seconds).unwrap_or(f64::NAN);
        let row = [
            f.dtype.name().to_string(),
            f.regime.name().to_string(),
            f.threads.to_string(),
            f.shape.0.to_string(),
            f.shape.1.to_string(),
            f.shape.2.to_string(),
            f.batch.to_string(),
            f.competitor.name().to_string(),
            num(report.alpha),
            num(report.beta),
            f.seconds.len().to_string(),
            num(median_s),
            num(f.gflops.median),
            num(f.gflops.lo),
            num(f.gflops.hi),
            num(f.bound.gflops),
            f.bound.limit.to_string(),
            num(f.fraction_of_bound()),
            rm,
            rl,
            rh,
            num(f.flops),
            num(f.bytes),
        ];
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// The limits as CSV: threads, quantity, unit, median, lo, hi, samples.
pub fn limits_csv(report: &Report) -> String {
    let mut out = String::from("threads,quantity,unit,median,lo,hi,samples\n");
    for l in &report.limits {
        let mut row = |q: &str, unit: &str, s: &Summary| {
            let _ = writeln!(
                out,
                "{},{q},{unit},{},{},{},{}",
                l.threads,
                num(s.median),
                num(s.lo),
                num(s.hi),
                s.samples
            );
        };
        row("fma_peak_f64", "GFLOP/s", &l.peak_f64);
        row("fma_peak_f32", "GFLOP/s", &l.peak_f32);
        row("l2_gemm_pattern", "GB/s", &l.l2);
        for (p, s) in &l.dram {
            let q = match p {
                crate::probe::Pattern::Gemm => "dram_gemm_pattern",
                crate::probe::Pattern::Copy => "dram_copy",
                crate::probe::Pattern::Triad => "dram_triad",
            };
            row(q, "GB/s", s);
        }
    }
    out
}

/// JIT latency as CSV: dtype, m, n, k, quantity, unit (seconds), median, lo, hi, samples.
pub fn latency_csv(report: &Report) -> String {
    let mut out = String::from("dtype,m,n,k,quantity,unit,median,lo,hi,samples\n");
    let Some(lat) = &report.latency else {
        return out;
    };
    if let Some((spec, t)) = &lat.first_in_process {
        let _ = writeln!(
            out,
            "{},{},{},{},first_in_process_miss,s,{},{},{},1",
            spec.dtype().name(),
            spec.m(),
            spec.n(),
            spec.k(),
            num(*t),
            num(*t),
            num(*t)
        );
    }
    for l in &lat.specs {
        let s = &l.spec;
        let mut row = |q: &str, v: &Summary| {
            let _ = writeln!(
                out,
                "{},{},{},{},{q},s,{},{},{},{}",
                s.dtype().name(),
                s.m(),
                s.n(),
                s.k(),
                num(v.median),
                num(v.lo),
                num(v.hi),
                v.samples
            );
        };
        row("smallgemm_miss", &l.miss);
        row("smallgemm_compile_time", &l.compile_time);
        row("smallgemm_hit", &l.hit);
        if let Some(v) = &l.libxsmm_miss {
            row("libxsmm_dispatch_miss", v);
        }
        if let Some(v) = &l.libxsmm_hit {
            row("libxsmm_dispatch_hit", v);
        }
        if let Some(v) = &l.mkl_create {
            row("mkl_jit_create", v);
        }
    }
    out
}

fn color(c: Competitor) -> RGBColor {
    match c {
        Competitor::Smallgemm => RGBColor(214, 39, 40),
        Competitor::Libxsmm => RGBColor(31, 119, 180),
        Competitor::MklJit => RGBColor(44, 160, 44),
        Competitor::Openblas => RGBColor(148, 103, 189),
        Competitor::NanoGemm => RGBColor(255, 127, 14),
        Competitor::Matrixmultiply => RGBColor(140, 86, 75),
        Competitor::Naive => RGBColor(127, 127, 127),
    }
}

/// An SVG with one panel per (dtype, regime, threads): GFLOP/s of each competitor against n
/// for the square shapes (m = n = k), with the bound. `None` when there is no square shape.
pub fn svg(report: &Report) -> Result<Option<String>, String> {
    let panels: Vec<(BlockKey, Rows)> = blocks(report)
        .into_iter()
        .map(|(k, rows)| {
            let rows: Vec<_> = rows
                .into_iter()
                .filter(|(s, _)| s.0 == s.1 && s.1 == s.2)
                .collect();
            (k, rows)
        })
        .filter(|(_, rows)| !rows.is_empty())
        .collect();
    if panels.is_empty() {
        return Ok(None);
    }
    let cols = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(cols);
    let (w, h) = (720 * cols as u32, 420 * rows as u32);
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((rows, cols));
        for (area, ((dtype, regime, threads), shapes)) in areas.iter().zip(&panels) {
            draw_panel(area, *dtype, *regime, *threads, shapes).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(Some(text))
}

type PanelResult = Result<(), Box<dyn std::error::Error>>;

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    dtype: Dtype,
    regime: Regime,
    threads: usize,
    shapes: &[(Shape, Vec<&Figure>)],
) -> PanelResult {
    let n_lo = shapes.iter().map(|(s, _)| s.0).min().unwrap_or(1) as f64;
    let n_hi = shapes.iter().map(|(s, _)| s.0).max().unwrap_or(1) as f64;
    let y_hi = shapes
        .iter()
        .flat_map(|(_, fs)| fs.iter().map(|f| f.gflops.hi.max(f.bound.gflops)))
        .fold(1.0f64, f64::max)
        * 1.08;
    let title = format!(
        "{} · {} · {} thread{}",
        dtype.name(),
        match regime {
            Regime::Hot => "hot (in L2)",
            Regime::Stream => "streaming (DRAM)",
        },
        threads,
        if threads == 1 { "" } else { "s" }
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d((n_lo - 0.5)..(n_hi + 0.5), 0.0..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("n (m = n = k)")
        .y_desc("GFLOP/s")
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    let bound: Vec<(f64, f64)> = shapes
        .iter()
        .map(|(s, fs)| (s.0 as f64, fs[0].bound.gflops))
        .collect();
    chart
        .draw_series(LineSeries::new(bound, BLACK.stroke_width(2)))?
        .label("bound")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(2)));
    let mut comps: Vec<Competitor> = shapes
        .iter()
        .flat_map(|(_, fs)| fs.iter().map(|f| f.competitor))
        .collect();
    comps.sort();
    comps.dedup();
    for c in comps {
        let pts: Vec<(f64, f64)> = shapes
            .iter()
            .filter_map(|(s, fs)| {
                fs.iter()
                    .find(|f| f.competitor == c)
                    .map(|f| (s.0 as f64, f.gflops.median))
            })
            .collect();
        let col = color(c);
        let width = if c == Competitor::Smallgemm { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(width)))?
            .label(c.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 2, col.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
