//! The timing harness: warm up, size each sample so the clock's resolution does not matter,
//! then time repeated samples. With several threads every thread runs its own share of the
//! work between two barriers, so a sample is the time of the slowest thread (wall time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// How long and how often to measure one figure.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Warm-up time before any sample (at least two calls; none when this and
    /// `min_sample` are zero).
    pub warmup: Duration,
    /// A sample runs the work repeatedly for at least this long.
    pub min_sample: Duration,
    /// Samples wanted.
    pub reps: usize,
    /// Fewest samples, even when `budget` is spent.
    pub min_reps: usize,
    /// Time after which no further sample starts once `min_reps` are in.
    pub budget: Duration,
}

impl Timing {
    pub fn validate(&self) -> Result<(), String> {
        if self.reps == 0 || self.min_reps == 0 || self.min_reps > self.reps {
            return Err(format!(
                "need 1 <= min_reps ({}) <= reps ({})",
                self.min_reps, self.reps
            ));
        }
        Ok(())
    }
}

/// Times `work(thread)` run on `threads` threads at once and returns the seconds of one
/// call of the work on all threads, one value per sample. `work` gets the thread's index
/// (0..threads) and must do that thread's share; the first error stops the measurement.
pub fn time_parallel<F>(threads: usize, timing: &Timing, work: F) -> Result<Vec<f64>, String>
where
    F: Fn(usize) -> Result<(), String> + Sync,
{
    timing.validate()?;
    if threads == 0 {
        return Err("threads must be at least 1".into());
    }
    let barrier = Barrier::new(threads);
    // Calls each thread makes in the next step; 0 tells the workers to stop.
    let inner = AtomicUsize::new(0);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let record = |e: String| {
        let mut f = failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(e);
    };
    // One step: every thread runs the work `inner` times between two barriers.
    let run_share = |t: usize, n: usize| {
        for _ in 0..n {
            if let Err(e) = work(t) {
                record(e);
                break;
            }
        }
    };
    let failed = || failure.lock().map(|f| f.is_some()).unwrap_or(true);
    let mut samples = Vec::with_capacity(timing.reps);
    std::thread::scope(|scope| {
        for t in 1..threads {
            let (barrier, inner, run_share) = (&barrier, &inner, &run_share);
            scope.spawn(move || loop {
                barrier.wait();
                let n = inner.load(Ordering::Acquire);
                if n == 0 {
                    break;
                }
                run_share(t, n);
                barrier.wait();
            });
        }
        // Thread 0 drives the steps and takes the time.
        let step = |n: usize| -> f64 {
            inner.store(n, Ordering::Release);
            barrier.wait();
            let start = Instant::now();
            run_share(0, n);
            barrier.wait();
            start.elapsed().as_secs_f64()
        };
        let begin = Instant::now();
        let mut once = f64::INFINITY;
        let mut warm_calls = 0;
        // No warm-up call when neither warm-up time nor sample length is asked for (a
        // streaming call is long and its data are cold by design), else at least two.
        let min_warm = if timing.warmup.is_zero() && timing.min_sample.is_zero() {
            0
        } else {
            2
        };
        while !failed() && (warm_calls < min_warm || begin.elapsed() < timing.warmup) {
            once = once.min(step(1));
            warm_calls += 1;
        }
        let per_sample =
            ((timing.min_sample.as_secs_f64() / once.max(1e-9)).ceil() as usize).clamp(1, 1 << 30);
        let measuring = Instant::now();
        while !failed()
            && samples.len() < timing.reps
            && (samples.len() < timing.min_reps || measuring.elapsed() < timing.budget)
        {
            samples.push(step(per_sample) / per_sample as f64);
        }
        // Release the workers.
        inner.store(0, Ordering::Release);
        barrier.wait();
    });
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(samples),
    }
}

/// Splits `total` items into `parts` contiguous chunks whose sizes differ by at most one:
/// (start, len) of chunk `i`.
pub fn chunk(total: usize, parts: usize, i: usize) -> (usize, usize) {
    let parts = parts.max(1);
    let (base, extra) = (total / parts, total % parts);
    let start = i * base + i.min(extra);
    (start, base + usize::from(i < extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Timing {
        Timing {
            warmup: Duration::from_millis(1),
            min_sample: Duration::from_micros(50),
            reps: 5,
            min_reps: 3,
            budget: Duration::from_secs(1),
        }
    }

    #[test]
    fn chunks_cover_everything_once() {
        for total in [0, 1, 7, 100] {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let (start, len) = chunk(total, parts, i);
                    assert_eq!(start, next);
                    next += len;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn every_thread_runs_and_samples_come_back() {
        let calls = [AtomicUsize::new(0), AtomicUsize::new(0)];
        let samples = time_parallel(2, &quick(), |t| {
            calls[t].fetch_add(1, Ordering::Relaxed);
            std::hint::black_box((0..100).sum::<u64>());
            Ok(())
        })
        .unwrap();
        assert_eq!(samples.len(), 5);
        assert!(samples.iter().all(|s| *s > 0.0));
        // Both threads ran the same number of calls.
        assert_eq!(
            calls[0].load(Ordering::Relaxed),
            calls[1].load(Ordering::Relaxed)
        );
    }

    #[test]
    fn an_error_stops_the_measurement() {
        let e = time_parallel(2, &quick(), |t| {
            if t == 1 {
                Err("boom".to_string())
            } else {
                Ok(())
            }
        });
        assert_eq!(e, Err("boom".to_string()));
        let bad = Timing { reps: 0, ..quick() };
        assert!(time_parallel(1, &bad, |_| Ok(())).is_err());
    }
}
