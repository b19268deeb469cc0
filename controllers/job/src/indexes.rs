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

    pub fn total(&self) -> i32 {
        self.0.iter().map(|i| i.last - i.first + 1).sum()
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
                Some(prev) if i.first <= prev.last + 1 => prev.last = prev.last.max(i.last),
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
