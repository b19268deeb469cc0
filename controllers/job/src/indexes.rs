//! Sets of completion indexes as ordered, non-adjacent intervals, with upstream's text form
//! (JR-24: `1,3-5,7`; runs of two as `a,b`) and its lenient parser.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub first: i32,
    pub last: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Intervals(pub Vec<Interval>);

impl Intervals {
    /// Parses `s`, dropping corrupted parts and everything `>= completions` (upstream
    /// `parseIndexesFromString`).
    pub fn parse(s: &str, completions: i32) -> Intervals {
        let mut out: Vec<Interval> = Vec::new();
        if s.is_empty() {
            return Intervals(out);
        }
        for part in s.split(',') {
            let mut limits = part.split('-');
            let Some(Ok(first)) = limits.next().map(str::parse::<i32>) else {
                continue;
            };
            if first >= completions {
                break;
            }
            let last = match limits.next() {
                Some(l) => match l.parse::<i32>() {
                    Ok(l) => l.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            match out.last_mut() {
                Some(prev) if prev.last == first - 1 => prev.last = last,
                _ => out.push(Interval { first, last }),
            }
        }
        Intervals(out)
    }

    /// How many indexes: reversed intervals count none, the sum saturates at i32::MAX (a user's
    /// string may repeat a range; `0-2147483646,0-2147483646` must not overflow).
    pub fn total(&self) -> i32 {
        let n: i64 = self
            .0
            .iter()
            .map(|i| (i64::from(i.last) - i64::from(i.first) + 1).max(0))
            .sum();
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    /// The same set sorted and merged, reversed (empty) intervals dropped: the form a user's
    /// string need not be in.
    pub fn normalized(&self) -> Intervals {
        Intervals(
            self.0
                .iter()
                .copied()
                .filter(|i| i.first <= i.last)
                .collect(),
        )
        .merge(&Intervals::default())
    }

    /// How many indexes of `self` are also in `other`, by interval overlap: never a walk over
    /// every index (a range may hold two billion).
    pub fn count_in(&self, other: &Intervals) -> i32 {
        let (a, b) = (self.normalized(), other.normalized());
        let mut n = 0i64;
        for x in &a.0 {
            for y in &b.0 {
                let (lo, hi) = (x.first.max(y.first), x.last.min(y.last));
                if lo <= hi {
                    n += i64::from(hi) - i64::from(lo) + 1;
                }
            }
        }
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    /// The first `count` indexes in `0..below` not in `self`, stepping over each interval at
    /// once (a completed range may hold two billion indexes).
    pub fn first_missing(&self, below: i32, count: usize) -> Vec<i32> {
        let below = i64::from(below);
        let mut out = Vec::new();
        let mut next = 0i64;
        let take_until = |stop: i64, next: &mut i64, out: &mut Vec<i32>| {
            while *next < stop.min(below) && out.len() < count {
                out.push(*next as i32); // 0 ≤ next < below ≤ i32::MAX
                *next += 1;
            }
        };
        for i in &self.normalized().0 {
            take_until(i64::from(i.first), &mut next, &mut out);
            if out.len() >= count || next >= below {
                return out;
            }
            next = next.max(i64::from(i.last) + 1);
        }
        take_until(below, &mut next, &mut out);
        out
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn has(&self, ix: i32) -> bool {
        let pos = self.0.partition_point(|i| i.last < ix);
        self.0.get(pos).is_some_and(|i| i.first <= ix)
    }

    /// The union with `other`, merging adjacent intervals.
    pub fn merge(&self, other: &Intervals) -> Intervals {
        let mut all: Vec<Interval> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_by_key(|i| i.first);
        let mut out: Vec<Interval> = Vec::with_capacity(all.len());
        for i in all {
            match out.last_mut() {
                Some(prev) if i.first <= prev.last.saturating_add(1) => {
                    prev.last = prev.last.max(i.last)
                }
                _ => out.push(i),
            }
        }
        Intervals(out)
    }

    /// The union with single indexes.
    pub fn with_indexes(&self, ixs: impl IntoIterator<Item = i32>) -> Intervals {
        let mut v: Vec<i32> = ixs.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        self.merge(&Intervals(
            v.into_iter()
                .map(|i| Interval { first: i, last: i })
                .collect(),
        ))
    }

    pub fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        self.0.iter().flat_map(|i| i.first..=i.last)
    }
}

impl fmt::Display for Intervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, i) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}", i.first)?;
            if i.last == i.first + 1 {
                write!(f, ",{}", i.last)?;
            } else if i.last > i.first {
                write!(f, "-{}", i.last)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jr24_text_form() {
        let cases: &[(&[i32], &str)] = &[
            (&[], ""),
            (&[0, 1], "0,1"),
            (&[1, 3, 4, 5, 7], "1,3-5,7"),
            (&[0, 1, 2, 3, 4], "0-4"),
            (&[2], "2"),
        ];
        for (ixs, want) in cases {
            let s = Intervals::default()
                .with_indexes(ixs.iter().copied())
                .to_string();
            assert_eq!(&s, want);
            // Round trip.
            assert_eq!(Intervals::parse(want, 100).to_string(), *want);
        }
    }

    #[test]
    fn parse_is_lenient_and_bounded_by_completions() {
        assert_eq!(Intervals::parse("0-9", 5).to_string(), "0-4");
        assert_eq!(Intervals::parse("1,x,3", 5).to_string(), "1,3");
        assert_eq!(Intervals::parse("1,2,3", 10).to_string(), "1-3");
        assert_eq!(Intervals::parse("7,8", 5).total(), 0);
    }

    /// PX-1: ranges up to i32::MAX - 1 (completions may be i32::MAX) are counted, skipped
    /// and intersected by interval, never index by index; repeated ranges do not overflow.
    #[test]
    fn huge_ranges_are_handled_by_interval() {
        let max = i32::MAX;
        let done = Intervals::parse("0-2147483645", max);
        let started = std::time::Instant::now();
        assert_eq!(done.first_missing(max, 3), vec![max - 1]);
        assert_eq!(done.count_in(&done), max - 1);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "walked every index: {:?}",
            started.elapsed()
        );
        assert_eq!(
            Intervals::parse("0-2147483645,0-2147483645", max).total(),
            max
        );
        let gaps = Intervals::parse("1,3-5,9", 10);
        assert_eq!(gaps.first_missing(10, 4), vec![0, 2, 6, 7]);
        assert_eq!(gaps.first_missing(10, 100), vec![0, 2, 6, 7, 8]);
        assert_eq!(gaps.first_missing(4, 100), vec![0, 2]);
        assert_eq!(gaps.count_in(&Intervals::parse("0-4", 10)), 3);
        let pods_at_max = Intervals::default().with_indexes([max, max - 1, 0]);
        assert_eq!(pods_at_max.to_string(), "0,2147483646,2147483647");
    }

    #[test]
    fn merge_has_total() {
        let a = Intervals::parse("0-2,6", 100);
        let b = Intervals::parse("3,8-9", 100);
        let m = a.merge(&b);
        assert_eq!(m.to_string(), "0-3,6,8,9");
        assert_eq!(m.total(), 7);
        assert!(m.has(3) && m.has(9) && !m.has(4) && !m.has(7) && !m.has(10));
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 6, 8, 9]);
    }
}
