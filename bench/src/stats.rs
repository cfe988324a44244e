//! Medians and their 95% bootstrap confidence intervals (the percentile method of paper 003:
//! resample with replacement, take the 2.5th and 97.5th percentiles of the statistic).

use smallgemm_ir::reference::SplitMix64;

/// Bootstrap resamples per interval: enough for stable 2.5/97.5 percentiles.
pub const RESAMPLES: usize = 2000;

/// A median with its 95% confidence interval, in the units of the samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
    /// How many samples it summarises.
    pub samples: usize,
}

impl Summary {
    /// The summary of `samples`; `None` when there are none or one is not finite.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let median = median(samples)?;
        let (lo, hi) = bootstrap_ci(samples, 0x5eed, median_sorted_in_place)?;
        Some(Summary {
            median,
            lo,
            hi,
            samples: samples.len(),
        })
    }

    /// `f(x)` applied to a decreasing transformation (time → rate): the interval flips.
    pub fn map_decreasing(&self, f: impl Fn(f64) -> f64) -> Summary {
        Summary {
            median: f(self.median),
            lo: f(self.hi),
            hi: f(self.lo),
            samples: self.samples,
        }
    }
}

/// The median of `samples` (mean of the middle two for an even count); `None` for an empty
/// slice or a non-finite sample.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut v = samples.to_vec();
    Some(median_sorted_in_place(&mut v))
}

fn median_sorted_in_place(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The `q`-quantile (0..=1) of sorted data, linear interpolation between order statistics.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos - pos.floor());
    let next = sorted.get(i + 1).copied().unwrap_or(sorted[i]);
    Some(sorted[i] + frac * (next - sorted[i]))
}

/// 95% percentile-bootstrap interval of `statistic` over `samples`, deterministic for a seed.
pub fn bootstrap_ci(
    samples: &[f64],
    seed: u64,
    mut statistic: impl FnMut(&mut [f64]) -> f64,
) -> Option<(f64, f64)> {
    if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let mut scratch = vec![0.0; samples.len()];
    let mut stats = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        for slot in scratch.iter_mut() {
            *slot = samples[(rng.next_u64() % samples.len() as u64) as usize];
        }
        stats.push(statistic(&mut scratch));
    }
    stats.sort_by(f64::total_cmp);
    Some((
        quantile_sorted(&stats, 0.025)?,
        quantile_sorted(&stats, 0.975)?,
    ))
}

/// Ratio of the medians of two sample sets (`num` / `den`) with a 95% bootstrap interval,
/// both sets resampled independently. `None` if either is empty or holds a non-positive or
/// non-finite value.
pub fn ratio_of_medians(num: &[f64], den: &[f64]) -> Option<Summary> {
    let ok = |s: &[f64]| !s.is_empty() && s.iter().all(|x| x.is_finite() && *x > 0.0);
    if !ok(num) || !ok(den) {
        return None;
    }
    let median_ratio = median(num)? / median(den)?;
    let mut rng = SplitMix64::new(0x7a71);
    let (mut a, mut b) = (vec![0.0; num.len()], vec![0.0; den.len()]);
    let mut stats = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        for slot in a.iter_mut() {
            *slot = num[(rng.next_u64() % num.len() as u64) as usize];
        }
        for slot in b.iter_mut() {
            *slot = den[(rng.next_u64() % den.len() as u64) as usize];
        }
        stats.push(median_sorted_in_place(&mut a) / median_sorted_in_place(&mut b));
    }
    stats.sort_by(f64::total_cmp);
    Some(Summary {
        median: median_ratio,
        lo: quantile_sorted(&stats, 0.025)?,
        hi: quantile_sorted(&stats, 0.975)?,
        samples: num.len().min(den.len()),
    })
}

/// Geometric mean of positive values; `None` if empty or any value is not positive.
pub fn geometric_mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return None;
    }
    Some((values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_known_data() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn quantiles_interpolate() {
        let v = [0.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(quantile_sorted(&v, 0.0), Some(0.0));
        assert_eq!(quantile_sorted(&v, 1.0), Some(40.0));
        assert_eq!(quantile_sorted(&v, 0.125), Some(5.0));
        assert_eq!(quantile_sorted(&v, 1.5), None);
    }

    #[test]
    fn bootstrap_interval_brackets_the_median() {
        // 1..=101: the median is 51; the 95% interval of a median of 101 uniform values
        // spans roughly ±10 around it.
        let data: Vec<f64> = (1..=101).map(f64::from).collect();
        let s = Summary::of(&data).unwrap();
        assert_eq!(s.median, 51.0);
        assert!(s.lo < 51.0 && s.lo > 35.0, "{s:?}");
        assert!(s.hi > 51.0 && s.hi < 67.0, "{s:?}");
        assert_eq!(s.samples, 101);
        // Deterministic: the same data gives the same interval.
        assert_eq!(Summary::of(&data), Some(s));
    }

    #[test]
    fn constant_data_has_a_zero_width_interval() {
        let s = Summary::of(&[2.5; 9]).unwrap();
        assert_eq!((s.median, s.lo, s.hi), (2.5, 2.5, 2.5));
    }

    #[test]
    fn decreasing_map_flips_the_interval() {
        let s = Summary {
            median: 2.0,
            lo: 1.0,
            hi: 4.0,
            samples: 3,
        };
        let r = s.map_decreasing(|t| 8.0 / t);
        assert_eq!((r.median, r.lo, r.hi), (4.0, 2.0, 8.0));
    }

    #[test]
    fn ratio_interval() {
        let num = [2.0, 2.0, 2.0, 2.0];
        let den = [1.0, 1.0, 1.0, 1.0];
        let r = ratio_of_medians(&num, &den).unwrap();
        assert_eq!((r.median, r.lo, r.hi), (2.0, 2.0, 2.0));
        assert!(ratio_of_medians(&num, &[]).is_none());
        assert!(ratio_of_medians(&num, &[0.0]).is_none());
    }

    #[test]
    fn geometric_mean_of_known_data() {
        assert!((geometric_mean(&[1.0, 4.0]).unwrap() - 2.0).abs() < 1e-12);
        assert!(geometric_mean(&[]).is_none());
        assert!(geometric_mean(&[1.0, -1.0]).is_none());
    }
}
