//! The few pieces of Go's standard library whose exact behaviour (and error text) decides which
//! schedules are valid: `strconv.Atoi`, `strconv.Quote`, `time.ParseDuration` and the time
//! package's own `quote`. Written from Go's documented semantics; the differential corpus
//! (`tests/e2e/cron_differential.rs`) compares every case with the real library. Flags parse
//! durations with the same `parse_duration`.

/// `strconv.Atoi` on a 64-bit platform, with its error text
/// (`strconv.Atoi: parsing "x": invalid syntax` / `value out of range`).
pub fn atoi(s: &str) -> Result<i64, String> {
    let syntax = || format!("strconv.Atoi: parsing {}: invalid syntax", strconv_quote(s));
    let range = || {
        format!(
            "strconv.Atoi: parsing {}: value out of range",
            strconv_quote(s)
        )
    };
    let bytes = s.as_bytes();
    let (neg, digits) = match bytes.first() {
        None => return Err(syntax()),
        Some(b'-') => (true, &bytes[1..]),
        Some(b'+') => (false, &bytes[1..]),
        Some(_) => (false, bytes),
    };
    if digits.is_empty() {
        return Err(syntax());
    }
    if bytes.len() < 19 {
        // Go's fast path: no overflow is possible below 19 bytes.
        let mut n: i64 = 0;
        for &c in digits {
            if !c.is_ascii_digit() {
                return Err(syntax());
            }
            n = n * 10 + i64::from(c - b'0');
        }
        return Ok(if neg { -n } else { n });
    }
    // Slow path (ParseUint then ParseInt's bounds): the first problem met, left to right, wins.
    let cutoff = u64::MAX / 10 + 1;
    let mut n: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(syntax());
        }
        if n >= cutoff {
            return Err(range());
        }
        n *= 10;
        let n1 = n.wrapping_add(u64::from(c - b'0'));
        if n1 < n {
            return Err(range());
        }
        n = n1;
    }
    let limit = 1u64 << 63;
    if (!neg && n >= limit) || (neg && n > limit) {
        return Err(range());
    }
    Ok(if neg {
        (n as i64).wrapping_neg()
    } else {
        n as i64
    })
}

/// `strconv.Quote`. Non-ASCII characters are kept unless they are control or white-space
/// characters (Go's `IsPrint` also escapes format characters such as U+200B, which cannot be
/// told apart without Unicode category tables; a schedule field never contains white space).
pub fn strconv_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (c as u32) >= 0x80 && (c.is_control() || c.is_whitespace()) => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32))
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The time package's `quote`: every byte of a non-ASCII or control character as `\xNN`.
pub fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if (c as u32) >= 0x80 || c < ' ' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Go's `1<<63`: the bound `time.ParseDuration` checks its unsigned sums against.
const LIMIT: u64 = 1 << 63;

/// `time.ParseDuration`: nanoseconds, with Go's error text.
pub fn parse_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", time_quote(orig));
    let mut s = orig;
    let mut neg = false;
    if let Some(c) = s.chars().next()
        && (c == '-' || c == '+')
    {
        neg = c == '-';
        s = &s[1..];
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: u64 = 0;
    while !s.is_empty() {
        let b = s.as_bytes();
        if !(b[0] == b'.' || b[0].is_ascii_digit()) {
            return Err(invalid());
        }
        let (v, pre) = leading_int(s).ok_or_else(invalid)?;
        s = &s[pre..];
        let (f, scale, post) = match s.strip_prefix('.') {
            Some(rest) => {
                let (f, scale, n) = leading_fraction(rest);
                s = &rest[n..];
                (f, scale, n)
            }
            None => (0, 1.0, 0),
        };
        if pre == 0 && post == 0 {
            return Err(invalid());
        }
        // Unit: everything up to the next digit or '.'.
        let end = s
            .bytes()
            .position(|c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if end == 0 {
            return Err(format!(
                "time: missing unit in duration {}",
                time_quote(orig)
            ));
        }
        let (u, rest) = s.split_at(end);
        s = rest;
        let unit = unit_nanos(u).ok_or_else(|| {
            format!(
                "time: unknown unit {} in duration {}",
                time_quote(u),
                time_quote(orig)
            )
        })?;
        if v > LIMIT / unit {
            return Err(invalid());
        }
        let mut v = v * unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        // Go's uint64 sum wraps (two terms of 1<<63 make 0, which passes its check): the same
        // answer here in every build, where `+` would panic with overflow checks on.
        d = d.wrapping_add(v);
        if d > LIMIT {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((d as i64).wrapping_neg());
    }
    if d > LIMIT - 1 {
        return Err(invalid());
    }
    Ok(d as i64)
}

/// `time.leadingInt`: the leading digits of `s` and how many there were; `None` past 1<<63.
fn leading_int(s: &str) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    let mut n = 0;
    for c in s.bytes().take_while(u8::is_ascii_digit) {
        if v > LIMIT / 10 {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
        if v > LIMIT {
            return None;
        }
        n += 1;
    }
    Some((v, n))
}

/// `time.leadingFraction`: the digits after a '.', their scale (10^kept digits) and how many
/// there were; it stops gaining precision on overflow and never fails.
fn leading_fraction(s: &str) -> (u64, f64, usize) {
    let (mut f, mut scale, mut overflow) = (0u64, 1f64, false);
    let mut n = 0;
    for c in s.bytes().take_while(u8::is_ascii_digit) {
        n += 1;
        if overflow {
            continue;
        }
        if f > (LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = f * 10 + u64::from(c - b'0');
        if y > LIMIT {
            overflow = true;
            continue;
        }
        f = y;
        scale *= 10.0;
    }
    (f, scale, n)
}

/// `time.unitMap`: nanoseconds per unit.
fn unit_nanos(u: &str) -> Option<u64> {
    Some(match u {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoi_as_go() {
        assert_eq!(atoi("+05"), Ok(5));
        assert_eq!(atoi("-0"), Ok(0));
        assert_eq!(atoi("0000000000000000000007"), Ok(7));
        assert_eq!(atoi("9223372036854775807"), Ok(i64::MAX));
        assert_eq!(atoi("-9223372036854775808"), Ok(i64::MIN));
        assert_eq!(
            atoi("9223372036854775808"),
            Err(r#"strconv.Atoi: parsing "9223372036854775808": value out of range"#.into())
        );
        assert_eq!(
            atoi(""),
            Err(r#"strconv.Atoi: parsing "": invalid syntax"#.into())
        );
        assert_eq!(
            atoi("+"),
            Err(r#"strconv.Atoi: parsing "+": invalid syntax"#.into())
        );
        assert_eq!(
            atoi("1_0"),
            Err(r#"strconv.Atoi: parsing "1_0": invalid syntax"#.into())
        );
        // Overflow met before the bad byte: range, as ParseUint reports.
        assert_eq!(
            atoi("99999999999999999999x"),
            Err(r#"strconv.Atoi: parsing "99999999999999999999x": value out of range"#.into())
        );
        assert_eq!(
            atoi("1234567890123456789x"),
            Err(r#"strconv.Atoi: parsing "1234567890123456789x": invalid syntax"#.into())
        );
    }

    #[test]
    fn durations_as_go() {
        assert_eq!(parse_duration("1m"), Ok(60_000_000_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration(".5s"), Ok(500_000_000));
        assert_eq!(parse_duration("-2s"), Ok(-2_000_000_000));
        assert_eq!(parse_duration("0"), Ok(0));
        // Two terms of 1<<63 wrap Go's uint64 sum to 0, which its check passes: Go answers 0,
        // and so does this in every build (with overflow checks, `+` panicked here).
        assert_eq!(
            parse_duration("9223372036854775808ns9223372036854775808ns"),
            Ok(0)
        );
        assert_eq!(parse_duration("3\u{b5}s"), Ok(3_000));
        assert_eq!(
            parse_duration("1"),
            Err(r#"time: missing unit in duration "1""#.into())
        );
        assert_eq!(
            parse_duration("1d"),
            Err(r#"time: unknown unit "d" in duration "1d""#.into())
        );
        assert_eq!(
            parse_duration("."),
            Err(r#"time: invalid duration ".""#.into())
        );
        assert_eq!(
            parse_duration("10000000h"),
            Err(r#"time: invalid duration "10000000h""#.into())
        );
        assert_eq!(
            parse_duration("1é"),
            Err(r#"time: unknown unit "\xc3\xa9" in duration "1\xc3\xa9""#.into())
        );
    }

    #[test]
    fn quotes_as_go() {
        assert_eq!(strconv_quote("a\"b\\c\td\u{1}"), r#""a\"b\\c\td\x01""#);
        assert_eq!(strconv_quote("é"), "\"é\"");
    }
}
