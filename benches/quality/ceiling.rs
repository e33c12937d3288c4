//! `--ceiling FORMAT`: how few bytes any choice of encoder quality per output could reach
//! against sharp's fixed quality, on this bench's own metric and with this machine's encoder.
//!
//! Every variant of the fixed profile is made at each of `--qualities` and scored (SSIM
//! against the Pillow reference, and SSIMULACRA2), so each output's bytes and scores are known
//! at every quality. Then, per rule, the fewest bytes that still reach sharp's mean score
//! (`--metric ssimulacra2`, the default, or `ssim`) with a worst output no worse than sharp's:
//!
//! - one quality for every output (what a fixed profile can do);
//! - one quality per width bucket (320 px and under, 640 and under, wider), the same for
//!   every photo;
//! - one quality per width bucket, each output raised to its own lowest quality reaching a
//!   SSIMULACRA2 floor: the bucket spends bytes where the mean gains most, the floor holds
//!   the worst;
//! - each output at its own lowest quality reaching a SSIMULACRA2 target, or a SSIM target:
//!   auto quality's rule with a perfect search at every width, the least target that reaches
//!   sharp's mean;
//! - each output at the quality chosen on the metric itself: a Lagrangian sweep (minimise
//!   bytes - lambda * SSIM per output, each output at least sharp's worst) refined greedily,
//!   what the best rule could reach; and the dual's floor, which no choice of these
//!   qualities per output can go below.

use std::collections::BTreeMap;

/// One output at one quality.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub bytes: u64,
    pub ssim: f64,
    pub ssimulacra2: f64,
}

/// Each output (photo, width): its point at each of `qualities` (ascending).
pub struct Grid {
    pub qualities: Vec<u8>,
    pub outputs: BTreeMap<(String, u32), Vec<Point>>,
    pub metric: Metric,
}

/// The score the mean and the worst are taken of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Metric {
    Ssim,
    Ssimulacra2,
}

impl Metric {
    pub fn parse(name: &str) -> Metric {
        match name {
            "ssim" => Metric::Ssim,
            "ssimulacra2" => Metric::Ssimulacra2,
            _ => panic!("--metric ssim|ssimulacra2"),
        }
    }

    fn of(self, p: &Point) -> f64 {
        match self {
            Metric::Ssim => p.ssim,
            Metric::Ssimulacra2 => p.ssimulacra2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::Ssim => "SSIM",
            Metric::Ssimulacra2 => "SSIMULACRA2",
        }
    }
}

/// sharp's figures at the fixed profile's quality: total bytes, mean and worst score.
#[derive(Debug, Clone, Copy)]
pub struct Sharp {
    pub bytes: u64,
    pub mean: f64,
    pub worst: f64,
}

/// Total bytes, mean and worst `metric` of `points`.
pub fn totals(metric: Metric, points: impl IntoIterator<Item = Point>) -> (u64, f64, f64) {
    let (mut n, mut bytes, mut total, mut worst) = (0, 0, 0.0, f64::INFINITY);
    for p in points {
        n += 1;
        bytes += p.bytes;
        total += metric.of(&p);
        worst = worst.min(metric.of(&p));
    }
    (bytes, total / n as f64, worst)
}

/// A choice of quality (an index into `qualities`) per output, in `outputs`' order.
type Choice = Vec<usize>;

impl Grid {
    /// Total bytes, mean and worst score of a choice.
    fn sum(&self, choice: &Choice) -> (u64, f64, f64) {
        totals(
            self.metric,
            self.outputs.values().zip(choice).map(|(p, i)| p[*i]),
        )
    }

    fn reaches(&self, choice: &Choice, sharp: Sharp) -> Option<(u64, f64, f64)> {
        let (bytes, mean, worst) = self.sum(choice);
        (mean >= sharp.mean && worst >= sharp.worst).then_some((bytes, mean, worst))
    }

    /// Each output at its own lowest quality whose `score` reaches `target` (the top else).
    fn lowest_reaching(&self, score: impl Fn(&Point) -> f64, target: f64) -> Choice {
        self.outputs
            .values()
            .map(|p| {
                p.iter()
                    .position(|p| score(p) >= target)
                    .unwrap_or(p.len() - 1)
            })
            .collect()
    }

    /// The fewest bytes reaching sharp by one quality per width bucket, each output raised
    /// to its own lowest quality reaching the SSIMULACRA2 `floor` when there is one.
    fn per_width(&self, sharp: Sharp, floor: Option<f64>) -> Option<((u64, f64, f64), [u8; 3])> {
        let bucket = |w: u32| match w {
            0..=320 => 0,
            321..=640 => 1,
            _ => 2,
        };
        let own = floor.map(|t| self.lowest_reaching(|p| p.ssimulacra2, t));
        let n = self.qualities.len();
        let mut best: Option<((u64, f64, f64), [u8; 3])> = None;
        for i in 0..n * n * n {
            let q = [i % n, i / n % n, i / (n * n)];
            let choice = self
                .outputs
                .keys()
                .enumerate()
                .map(|(o, (_, w))| q[bucket(*w)].max(own.as_ref().map_or(0, |own| own[o])))
                .collect();
            if let Some(r) = self.reaches(&choice, sharp)
                && best.is_none_or(|(b, _)| r.0 < b.0)
            {
                best = Some((r, q.map(|i| self.qualities[i])));
            }
        }
        best
    }

    /// The fewest bytes reaching sharp by any quality per output, and a floor under them.
    ///
    /// Per lambda, each output at the quality minimising bytes - lambda * score among those at
    /// least sharp's worst; the best of those is then lowered greedily (the step saving most
    /// bytes per SSIM lost) while the mean holds, for what a lambda's steps leave over. The
    /// floor is weak duality: any choice meeting the mean has bytes >= sum of those minima +
    /// lambda * n * sharp's mean, for every lambda; the largest such sum is no choice's to beat.
    fn lagrangian(&self, sharp: Sharp) -> Option<((u64, f64, f64), f64)> {
        let n = self.outputs.len() as f64;
        let mut best: Option<(u64, f64, f64, Choice)> = None;
        let mut floor = f64::NEG_INFINITY;
        let score = |p: &Point| self.metric.of(p);
        // Bytes per unit of score: from nothing to far past the steepest step on the corpus
        // (SSIMULACRA2's unit is about 10^4 times SSIM's).
        let unit = match self.metric {
            Metric::Ssim => 1.0,
            Metric::Ssimulacra2 => 1e-4,
        };
        for lambda in (0..4000).map(|i| (1e3 * 1.004f64.powi(i) - 1e3) * unit) {
            let cost = |p: &Point| p.bytes as f64 - lambda * score(p);
            let mut dual = lambda * n * sharp.mean;
            let mut choice = Choice::new();
            for p in self.outputs.values() {
                // No quality keeps this output at sharp's worst: no choice reaches sharp.
                let i = (0..p.len())
                    .filter(|i| score(&p[*i]) >= sharp.worst)
                    .min_by(|a, b| cost(&p[*a]).total_cmp(&cost(&p[*b])))?;
                dual += cost(&p[i]);
                choice.push(i);
            }
            floor = floor.max(dual);
            if let Some(r) = self.reaches(&choice, sharp)
                && best.as_ref().is_none_or(|b| r.0 < b.0)
            {
                best = Some((r.0, r.1, r.2, choice));
            }
        }
        let (.., mut choice) = best?;
        let points: Vec<&Vec<Point>> = self.outputs.values().collect();
        let mut total: f64 = points.iter().zip(&choice).map(|(p, i)| score(&p[*i])).sum();
        loop {
            // The one-step lowering with the most bytes saved per SSIM lost that keeps both
            // the mean and the output's floor.
            let step = (0..points.len())
                .filter(|o| choice[*o] > 0)
                .map(|o| (o, points[o][choice[o]], points[o][choice[o] - 1]))
                .filter(|(_, now, lower)| {
                    score(lower) >= sharp.worst
                        && (total - score(now) + score(lower)) / n >= sharp.mean
                        && lower.bytes < now.bytes
                })
                .max_by(|(_, a, la), (_, b, lb)| {
                    let gain = |now: &Point, lower: &Point| {
                        (now.bytes - lower.bytes) as f64 / (score(now) - score(lower)).max(1e-12)
                    };
                    gain(a, la).total_cmp(&gain(b, lb))
                });
            let Some((o, now, lower)) = step else { break };
            total += score(&lower) - score(&now);
            choice[o] -= 1;
        }
        Some((self.reaches(&choice, sharp)?, floor))
    }

    /// Prints the rules' figures against sharp's.
    pub fn report(&self, format: &str, sharp: Sharp) {
        let line = |rule: &str, r: Option<(u64, f64, f64)>| match r {
            Some((bytes, mean, worst)) => println!(
                "| {format} | {rule} | {bytes} | {:.3}x | {mean:.5} | {worst:.5} |",
                bytes as f64 / sharp.bytes as f64
            ),
            None => println!("| {format} | {rule} | - | not reached | - | - |"),
        };
        let m = self.metric.name();
        println!(
            "\n{} outputs of {format} at qualities {:?}; sharp: {} bytes, mean {m} {:.5}, worst \
             {:.5}",
            self.outputs.len(),
            self.qualities,
            sharp.bytes,
            sharp.mean,
            sharp.worst
        );
        println!("\n| format | rule | bytes | vs sharp | mean {m} | worst {m} |");
        println!("|---|---|---|---|---|---|");
        for (i, q) in self.qualities.iter().enumerate() {
            let (bytes, mean, worst) = self.sum(&vec![i; self.outputs.len()]);
            line(&format!("every output at q{q}"), Some((bytes, mean, worst)));
        }
        match self.per_width(sharp, None) {
            Some((r, q)) => line(&format!("per width q{}/q{}/q{}", q[0], q[1], q[2]), Some(r)),
            None => line("per width", None),
        }
        // The floors auto quality's targets span ("medium" 50 to "very high" 80).
        for floor in (50..=80).step_by(5).map(f64::from) {
            match self.per_width(sharp, Some(floor)) {
                Some((r, q)) => line(
                    &format!(
                        "per width q{}/q{}/q{}, each output raised to SSIMULACRA2 {floor}",
                        q[0], q[1], q[2]
                    ),
                    Some(r),
                ),
                None => line(&format!("per width, raised to SSIMULACRA2 {floor}"), None),
            }
        }
        // The least target reaching sharp: SSIMULACRA2 in steps of 1, SSIM of 0.0001.
        let least = |score: &dyn Fn(&Point) -> f64, targets: &mut dyn Iterator<Item = f64>| {
            targets
                .map(|t| (t, self.reaches(&self.lowest_reaching(score, t), sharp)))
                .find(|(_, r)| r.is_some())
        };
        match least(&|p| p.ssimulacra2, &mut (30..=100).map(f64::from)) {
            Some((t, r)) => line(&format!("each output's own quality for SSIMULACRA2 {t}"), r),
            None => line("each output's own quality for a SSIMULACRA2 target", None),
        }
        match least(&|p| p.ssim, &mut (9900..=10000).map(|t| t as f64 / 1e4)) {
            Some((t, r)) => line(&format!("each output's own quality for SSIM {t:.4}"), r),
            None => line("each output's own quality for a SSIM target", None),
        }
        let (found, floor) = self.lagrangian(sharp).unzip();
        line("each output's quality chosen on the metric", found);
        if let Some(floor) = floor {
            println!(
                "| {format} | no choice of these qualities per output below | {floor:.0} | \
                 {:.3}x | - | - |",
                floor / sharp.bytes as f64
            );
        }
    }
}
