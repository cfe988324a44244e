//! A tiny run of the whole bench machinery: the limits, both regimes, two threads, the
//! checks, the table, the CSV files and the SVG. No timing assertions: only structure.

use std::time::Duration;

use smallgemm::Dtype;
use smallgemm_bench::report::{self, CSV_COLUMNS};
use smallgemm_bench::{run, Competitor, Config, Regime, Timing};

fn tiny() -> Option<Config> {
    if smallgemm::supported_isas().is_empty() {
        return None; // no AVX2/AVX-512: nothing to run
    }
    let quick = Timing {
        warmup: Duration::from_millis(1),
        min_sample: Duration::from_micros(200),
        reps: 3,
        min_reps: 3,
        budget: Duration::from_millis(50),
    };
    Some(Config {
        dtypes: vec![Dtype::F64, Dtype::F32],
        shapes: vec![(2, 2, 2), (5, 5, 5), (8, 8, 4)],
        regimes: vec![Regime::Hot, Regime::Stream],
        threads: vec![1, 2],
        competitors: vec![
            Competitor::Smallgemm,
            Competitor::NanoGemm,
            Competitor::Matrixmultiply,
            Competitor::Naive,
        ],
        hot_bytes: 64 << 10,
        stream_bytes: 2 << 20,
        hot: quick,
        stream: Timing {
            warmup: Duration::ZERO,
            ..quick
        },
        probe: quick,
        latency_reps: 3,
        ..Config::standard()
    })
}

#[test]
fn a_tiny_run_reports_every_figure() {
    let Some(config) = tiny() else { return };
    let mut lines = Vec::new();
    let r = run(&config, &mut |l| lines.push(l.to_string())).unwrap();
    assert!(!lines.is_empty());
    assert!(r.check_failures.is_empty(), "{:?}", r.check_failures);
    // 2 dtypes x 2 regimes x 2 thread counts x 3 shapes x 4 competitors.
    assert_eq!(r.figures.len(), 2 * 2 * 2 * 3 * 4);
    assert_eq!(r.limits.len(), 2);
    for l in &r.limits {
        assert!(l.peak_f64.median > 0.0 && l.l2.median > 0.0);
        assert_eq!(l.dram.len(), 3);
    }
    for f in &r.figures {
        assert!(f.gflops.lo <= f.gflops.median && f.gflops.median <= f.gflops.hi);
        assert!(f.bound.gflops > 0.0 && f.gflops.median > 0.0);
        assert_eq!(f.ratio.is_some(), f.competitor != Competitor::Smallgemm);
        let limit = if f.regime == Regime::Hot {
            ["fma-peak", "l2"]
        } else {
            ["fma-peak", "dram"]
        };
        assert!(limit.contains(&f.bound.limit), "{:?}", f.bound);
    }
    let lat = r.latency.as_ref().unwrap();
    assert!(lat.first_in_process.is_some());
    assert_eq!(lat.specs.len(), 2 * 3);

    let csv = report::csv(&r);
    let mut rows = csv.lines();
    assert_eq!(rows.next().unwrap(), CSV_COLUMNS.join(","));
    let rows: Vec<&str> = rows.collect();
    assert_eq!(rows.len(), r.figures.len());
    assert!(rows
        .iter()
        .all(|l| l.split(',').count() == CSV_COLUMNS.len()));
    assert!(report::limits_csv(&r).lines().count() == 1 + 2 * 6);
    assert!(report::latency_csv(&r).contains("smallgemm_hit"));

    let table = report::table(&r);
    for c in &config.competitors {
        assert!(table.contains(c.name()), "{}", c.name());
    }
    let svg = report::svg(&r).unwrap().unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("smallgemm"));
}

#[test]
fn bad_configurations_are_errors() {
    let Some(good) = tiny() else { return };
    let bad = [
        Config {
            shapes: vec![],
            ..good.clone()
        },
        Config {
            threads: vec![0],
            ..good.clone()
        },
        Config {
            shapes: vec![(0, 1, 1)],
            ..good.clone()
        },
        Config {
            dtypes: vec![Dtype::F16],
            ..good.clone()
        },
        Config {
            alpha: f64::NAN,
            ..good.clone()
        },
        Config {
            stream_bytes: 1,
            ..good.clone()
        },
    ];
    for c in bad {
        assert!(run(&c, &mut |_| {}).is_err());
    }
}

#[test]
fn libxsmm_is_left_out_for_other_scalars() {
    let Some(good) = tiny() else { return };
    let c = Config {
        alpha: 1.5,
        beta: 0.5,
        regimes: vec![Regime::Hot],
        threads: vec![1],
        shapes: vec![(3, 3, 3)],
        competitors: vec![
            Competitor::Smallgemm,
            Competitor::Libxsmm,
            Competitor::Naive,
        ],
        latency_reps: 0,
        ..good
    };
    let r = run(&c, &mut |_| {}).unwrap();
    assert!(r
        .figures
        .iter()
        .all(|f| f.competitor != Competitor::Libxsmm));
    assert!(r.notes.iter().any(|n| n.starts_with("libxsmm")));
    assert!(r.latency.is_none());
}
