//! The arithmetic of the Prometheus tools: summaries of a series' samples (non-finite ones
//! skipped), even down-sampling, and the z-scores that compare a window with its baseline.

/// Fewest finite baseline samples for a z-score.
pub(super) const MIN_BASELINE_SAMPLES: usize = 10;

/// The arithmetic mean; `None` for no values.
pub(super) fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / values.len() as f64)
}

/// The population standard deviation; `None` for no values.
pub(super) fn stddev(values: &[f64]) -> Option<f64> {
    let m = mean(values)?;
    let var = values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / values.len() as f64;
    Some(var.sqrt())
}

/// The `q` quantile (0..=1) of ascending `sorted` values, interpolating linearly between the
/// closest ranks (rank = q × (n − 1)).
pub(super) fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (*sorted.get(lo)?, *sorted.get(hi)?);
    Some(a + (b - a) * (rank - lo as f64))
}

/// `(x − mean) / stddev`; `None` when the deviation is zero (or too small to divide by) or
/// anything is not finite.
pub(super) fn z_score(x: f64, mean: f64, stddev: f64) -> Option<f64> {
    if constant(mean, stddev) {
        return None;
    }
    let z = (x - mean) / stddev;
    z.is_finite().then_some(z)
}

/// Whether a distribution with this mean and deviation is constant (up to rounding).
pub(super) fn constant(mean: f64, stddev: f64) -> bool {
    !stddev.is_finite() || stddev <= mean.abs() * 1e-12 || stddev == 0.0
}

/// Whether `a` and `b` differ beyond rounding.
pub(super) fn differs(a: f64, b: f64) -> bool {
    (a - b).abs() > 1e-9 * a.abs().max(b.abs())
}

/// At most `max` indices of `0..n`, evenly spaced, first and last included.
pub(super) fn downsample(n: usize, max: usize) -> Vec<usize> {
    if n <= max {
        return (0..n).collect();
    }
    match max {
        0 => Vec::new(),
        1 => vec![n - 1],
        _ => (0..max)
            .map(|i| (2 * i * (n - 1) + (max - 1)) / (2 * (max - 1)))
            .collect(),
    }
}

/// Statistics of the finite values of a series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Summary {
    pub(super) count: usize,
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) mean: f64,
    pub(super) stddev: f64,
    pub(super) p50: f64,
    pub(super) p95: f64,
    pub(super) p99: f64,
}

/// The statistics of `values` (finite ones only); `None` when none is finite.
pub(super) fn summarize(values: &[f64]) -> Option<Summary> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    Some(Summary {
        count: sorted.len(),
        min: *sorted.first()?,
        max: *sorted.last()?,
        mean: mean(&sorted)?,
        stddev: stddev(&sorted)?,
        p50: percentile(&sorted, 0.50)?,
        p95: percentile(&sorted, 0.95)?,
        p99: percentile(&sorted, 0.99)?,
    })
}

/// How many values are not finite.
pub(super) fn non_finite(values: &[f64]) -> usize {
    values.iter().filter(|v| !v.is_finite()).count()
}

/// `v` rounded to 6 significant digits, for messages.
pub(super) fn sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return v.to_string();
    }
    let digits = 5 - v.abs().log10().floor() as i32;
    let scale = 10f64.powi(digits);
    let rounded = (v * scale).round() / scale;
    if rounded.is_finite() {
        rounded.to_string()
    } else {
        v.to_string()
    }
}

/// Rounds to 3 decimals (z-scores).
pub(super) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// One series compared with its baseline.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Comparison {
    pub(super) baseline: Option<Summary>,
    pub(super) window: Option<Summary>,
    pub(super) z_mean: Option<f64>,
    pub(super) z_max: Option<f64>,
    pub(super) z_min: Option<f64>,
    pub(super) anomaly: bool,
    /// Why it is (or is not) an anomaly, or why there is no z-score.
    pub(super) reason: Option<String>,
}

impl Comparison {
    /// The z of the largest magnitude.
    pub(super) fn z(&self) -> Option<f64> {
        [self.z_mean, self.z_max, self.z_min]
            .into_iter()
            .flatten()
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
    }

    /// Sort key: anomalies without a z first, then by |z|, then the rest.
    pub(super) fn rank(&self) -> f64 {
        match self.z() {
            Some(z) => z.abs(),
            None if self.anomaly => f64::INFINITY,
            None => -1.0,
        }
    }
}

/// Compares the window's values with the baseline's (non-finite ones skipped).
pub(super) fn compare(baseline: &[f64], window: &[f64], threshold: f64) -> Comparison {
    let b = summarize(baseline);
    let w = summarize(window);
    let mut out = Comparison {
        baseline: b,
        window: w,
        z_mean: None,
        z_max: None,
        z_min: None,
        anomaly: false,
        reason: None,
    };
    let (b, w) = match (b, w) {
        (_, None) => {
            out.reason = Some("no finite samples in the window".into());
            return out;
        }
        (None, _) => {
            out.reason = Some("no finite samples in the baseline".into());
            return out;
        }
        (Some(b), Some(w)) => (b, w),
    };
    if b.count < MIN_BASELINE_SAMPLES {
        out.reason = Some(format!(
            "only {} finite baseline samples (at least {MIN_BASELINE_SAMPLES} are needed for a z-score); use a longer baseline",
            b.count
        ));
        return out;
    }
    if constant(b.mean, b.stddev) {
        let differing: Vec<String> = [("mean", w.mean), ("max", w.max), ("min", w.min)]
            .into_iter()
            .filter(|(_, v)| differs(*v, b.mean))
            .map(|(name, v)| format!("{name} {}", sig(v)))
            .collect();
        if differing.is_empty() {
            out.reason = Some(format!(
                "the baseline was constant at {} and the window matches it (no z-score: the standard deviation is 0)",
                sig(b.mean)
            ));
        } else {
            out.anomaly = true;
            out.reason = Some(format!(
                "the baseline was constant at {} over {} samples and the window differs (window {}); no z-score: the standard deviation is 0",
                sig(b.mean),
                b.count,
                differing.join(", ")
            ));
        }
        return out;
    }
    out.z_mean = z_score(w.mean, b.mean, b.stddev);
    out.z_max = z_score(w.max, b.mean, b.stddev);
    out.z_min = z_score(w.min, b.mean, b.stddev);
    if let Some(z) = out.z()
        && z.abs() >= threshold
    {
        out.anomaly = true;
        let (name, value) = if out.z_mean == Some(z) {
            ("mean", w.mean)
        } else if out.z_max == Some(z) {
            ("max", w.max)
        } else {
            ("min", w.min)
        };
        out.reason = Some(format!(
            "the window {name} {} is {:.1} standard deviations {} the baseline mean {} (stddev {})",
            sig(value),
            z.abs(),
            if z > 0.0 { "above" } else { "below" },
            sig(b.mean),
            sig(b.stddev)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_interpolate_linearly() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 1.0), Some(4.0));
        assert_eq!(percentile(&v, 0.5), Some(2.5));
        // rank 0.95 * 3 = 2.85 → 3 + 0.85
        assert!(close(percentile(&v, 0.95).unwrap_or_default(), 3.85));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&v, 1.5), None);
        let hundred: Vec<f64> = (1..=101).map(f64::from).collect();
        assert!(close(percentile(&hundred, 0.99).unwrap_or_default(), 100.0));
        assert!(close(percentile(&hundred, 0.95).unwrap_or_default(), 96.0));
    }

    #[test]
    fn mean_and_population_stddev() {
        let v = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&v), Some(5.0));
        assert_eq!(stddev(&v), Some(2.0));
        assert_eq!(mean(&[]), None);
        assert_eq!(stddev(&[]), None);
        assert_eq!(stddev(&[3.0]), Some(0.0));
    }

    #[test]
    fn z_scores() {
        assert_eq!(z_score(11.0, 5.0, 2.0), Some(3.0));
        assert_eq!(z_score(1.0, 5.0, 2.0), Some(-2.0));
        assert_eq!(z_score(6.0, 5.0, 0.0), None);
        // A constant of 0.1 whose mean picked up rounding noise.
        let tenths = [0.1; 7];
        let (m, s) = (
            mean(&tenths).unwrap_or_default(),
            stddev(&tenths).unwrap_or_default(),
        );
        assert!(constant(m, s), "{m} {s}");
        assert_eq!(z_score(0.1, m, s), None);
    }

    #[test]
    fn downsampling_is_even_and_keeps_the_ends() {
        assert_eq!(downsample(5, 60), vec![0, 1, 2, 3, 4]);
        assert_eq!(downsample(9, 3), vec![0, 4, 8]);
        assert_eq!(downsample(10, 4), vec![0, 3, 6, 9]);
        let picked = downsample(240, 60);
        assert_eq!(picked.len(), 60);
        assert_eq!(picked.first(), Some(&0));
        assert_eq!(picked.last(), Some(&239));
        assert!(picked.windows(2).all(|w| w[1] > w[0] && w[1] - w[0] <= 5));
        assert_eq!(downsample(10, 1), vec![9]);
        assert!(downsample(10, 0).is_empty());
    }

    #[test]
    fn summaries_skip_non_finite_values() {
        let v = [f64::NAN, 1.0, f64::INFINITY, 3.0, 2.0, f64::NEG_INFINITY];
        let s = summarize(&v).unwrap_or_else(|| panic!("no summary"));
        assert_eq!(s.count, 3);
        assert_eq!((s.min, s.max, s.mean, s.p50), (1.0, 3.0, 2.0, 2.0));
        assert_eq!(non_finite(&v), 3);
        assert_eq!(summarize(&[f64::NAN]), None);
    }

    #[test]
    fn comparisons() {
        let baseline: Vec<f64> = (0..100).map(|i| 100.0 + f64::from(i % 5) - 2.0).collect();
        let spike = compare(&baseline, &[400.0; 10], 3.0);
        assert!(spike.anomaly);
        assert!(spike.z_mean.unwrap_or_default() > 100.0);
        let calm = compare(&baseline, &[99.0, 100.0, 101.0], 3.0);
        assert!(!calm.anomaly, "{calm:?}");
        assert!(calm.z().unwrap_or(9.0).abs() < 3.0);
        let dip = compare(&baseline, &[100.0, 0.0, 100.0], 3.0);
        assert!(dip.anomaly);
        assert!(dip.z_min.unwrap_or_default() < -3.0);
        assert!(dip.reason.unwrap_or_default().contains("min 0"));

        let flat = compare(&[5.0; 50], &[5.0; 5], 3.0);
        assert!(!flat.anomaly && flat.z().is_none());
        let changed = compare(&[0.0; 50], &[0.0, 0.5], 3.0);
        assert!(changed.anomaly && changed.z().is_none());
        assert_eq!(changed.rank(), f64::INFINITY);
        let short = compare(&[1.0, 2.0], &[50.0], 3.0);
        assert!(
            !short.anomaly
                && short
                    .reason
                    .unwrap_or_default()
                    .contains("baseline samples")
        );
        let empty = compare(&baseline, &[f64::NAN], 3.0);
        assert!(!empty.anomaly && empty.window.is_none());
    }

    #[test]
    fn six_significant_digits() {
        assert_eq!(sig(2f64.sqrt()), "1.41421");
        assert_eq!(sig(123_456_789.0), "123457000");
        assert_eq!(sig(0.000_012_345_678), "0.0000123457");
        assert_eq!(sig(-400.0), "-400");
    }
}
