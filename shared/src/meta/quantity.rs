//! Kubernetes' `resource.Quantity` as the API server parses it (the amounts the controllers
//! compute with, e.g. node CPU for topology hints).

/// Magnitudes saturate here (10^28 cores, far beyond any milli-value an i64 can hold), which
/// keeps sums of many saturated quantities inside i128.
const NANO_CAP: i128 = 10_i128.pow(37);
/// Upstream caps binary-suffixed quantities at `math.MaxInt64` units.
const MAX_ALLOWED_NANO: i128 = (i64::MAX as i128) * 1_000_000_000;

/// The milli-value of a Kubernetes quantity string, as upstream `Quantity.MilliValue()`:
/// ⌈q·1000⌉ (away from zero for negatives), after upstream's parse-time rounding up to a
/// whole nano unit; saturating at the i64 bounds where upstream would overflow. `None` when
/// `ParseQuantity` rejects the string.
pub fn milli_value(quantity: &str) -> Option<i64> {
    parse_nano(quantity).map(nano_to_milli)
}

/// ⌈nano / 10^6⌉ rounded away from zero, saturated to i64: upstream's `MilliValue()` of an
/// amount held in nano units, e.g. a sum of [`parse_nano`] results.
pub fn nano_to_milli(nano: i128) -> i64 {
    let q = nano / 1_000_000;
    let r = nano % 1_000_000;
    let q = if r == 0 {
        q
    } else {
        q.saturating_add(nano.signum())
    };
    i64::try_from(q).unwrap_or(if q < 0 { i64::MIN } else { i64::MAX })
}

/// Upstream `ParseQuantity` (scanner `parseQuantityString` plus suffix interpretation): the
/// exact value in nano units, magnitude rounded up to a whole nano unit, binary suffixes
/// capped at `MaxInt64` units, magnitude saturating at [`NANO_CAP`]. `None` when upstream
/// rejects the string.
pub fn parse_nano(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut pos = 0;
    let negative = match b.first() {
        Some(b'-') => {
            pos = 1;
            true
        }
        Some(b'+') => {
            pos = 1;
            false
        }
        _ => false,
    };
    // Leading zeros; a string of only sign and zeros is zero (upstream accepts "-" and "+").
    let zeros_start = pos;
    while b.get(pos) == Some(&b'0') {
        pos += 1;
    }
    if pos == b.len() {
        return Some(0);
    }
    let had_zeros = pos > zeros_start;
    let num_start = pos;
    while b.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    let num = b.get(num_start..pos)?;
    let mut denom: &[u8] = &[];
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let denom_start = pos;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        denom = b.get(denom_start..pos)?;
    }

    // Suffix shape: [eEinumkKMGTP]* [+-]? [0-9]* up to the end.
    let suffix = b.get(pos..)?;
    let mut i = pos;
    while b.get(i).is_some_and(|c| b"eEinumkKMGTP".contains(c)) {
        i += 1;
    }
    if matches!(b.get(i), Some(b'+' | b'-')) {
        i += 1;
    }
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    if i != b.len() {
        return None;
    }
    let (binary_shift, exponent) = interpret_suffix(suffix)?;
    if !had_zeros && num.is_empty() && denom.is_empty() {
        // No digit at all ("e3", "+Ki", ".Pi"): upstream reads the numerator as 0 on its
        // int64 fast path, but its decimal fallback (taken for exponents below nano and for
        // Pi/Ei) rejects the digitless number.
        let fast_path = if binary_shift > 0 {
            binary_shift <= 40
        } else {
            exponent >= -9
        };
        return fast_path.then_some(0);
    }

    // Mantissa digits without leading zeros; the value is digits · 10^exp10 · 2^binary_shift.
    let mut digits: Vec<u8> = num
        .iter()
        .chain(denom)
        .map(|c| c.wrapping_sub(b'0'))
        .skip_while(|d| *d == 0)
        .collect();
    if digits.is_empty() {
        return Some(0);
    }
    let denom_len = i64::try_from(denom.len()).unwrap_or(i64::MAX);
    let exp10 = exponent.saturating_sub(denom_len);
    if binary_shift > 0 {
        digits = multiply_digits(&digits, 1u64 << binary_shift);
    }
    let mut magnitude = digits_to_nano(&digits, exp10);
    if binary_shift > 0 {
        magnitude = magnitude.min(MAX_ALLOWED_NANO);
    }
    Some(if negative { -magnitude } else { magnitude })
}

/// Suffix → (binary shift, decimal exponent). Decimal exponents beyond i64 are rejected like
/// upstream's `strconv.ParseInt`; upstream then truncates to int32, here they saturate.
fn interpret_suffix(suffix: &[u8]) -> Option<(u32, i64)> {
    Some(match suffix {
        b"" => (0, 0),
        b"n" => (0, -9),
        b"u" => (0, -6),
        b"m" => (0, -3),
        b"k" => (0, 3),
        b"M" => (0, 6),
        b"G" => (0, 9),
        b"T" => (0, 12),
        b"P" => (0, 15),
        b"E" => (0, 18),
        b"Ki" => (10, 0),
        b"Mi" => (20, 0),
        b"Gi" => (30, 0),
        b"Ti" => (40, 0),
        b"Pi" => (50, 0),
        b"Ei" => (60, 0),
        [b'e' | b'E', rest @ ..] if !rest.is_empty() => {
            let rest = std::str::from_utf8(rest).ok()?;
            (0, rest.parse::<i64>().ok()?)
        }
        _ => return None,
    })
}

/// Decimal digit string (most significant first) times `factor`, without leading zeros.
fn multiply_digits(digits: &[u8], factor: u64) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(digits.len().saturating_add(20));
    let mut carry: u128 = 0;
    for d in digits.iter().rev() {
        let v = u128::from(*d) * u128::from(factor) + carry;
        out.push((v % 10) as u8);
        carry = v / 10;
    }
    while carry > 0 {
        out.push((carry % 10) as u8);
        carry /= 10;
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    out.reverse();
    out
}

/// ⌈digits · 10^(exp10+9)⌉ (digits without leading zeros, not empty), saturating at
/// [`NANO_CAP`].
fn digits_to_nano(digits: &[u8], exp10: i64) -> i128 {
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let shift = exp10.saturating_add(9);
    // 37 digits stay below NANO_CAP = 10^37.
    const MAX_DIGITS: i64 = 37;
    let value_of = |ds: &[u8]| ds.iter().fold(0i128, |acc, d| acc * 10 + i128::from(*d));
    if shift >= 0 {
        if len.saturating_add(shift) > MAX_DIGITS {
            return NANO_CAP;
        }
        // Both fit: len + shift ≤ 37.
        let pow = 10_i128.pow(u32::try_from(shift).unwrap_or(0));
        return value_of(digits).saturating_mul(pow).min(NANO_CAP);
    }
    let cut = shift.unsigned_abs();
    let keep = (len as u64).saturating_sub(cut);
    if keep == 0 {
        // Below one nano unit but not zero: rounded up.
        return 1;
    }
    if keep > MAX_DIGITS as u64 {
        return NANO_CAP;
    }
    let keep = usize::try_from(keep).unwrap_or(0);
    let (int_part, frac) = digits.split_at(keep.min(digits.len()));
    let round_up = frac.iter().any(|d| *d != 0);
    (value_of(int_part) + i128::from(round_up)).min(NANO_CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milli_value_table() {
        let cases: &[(&str, Option<i64>)] = &[
            ("0", Some(0)),
            ("1", Some(1000)),
            ("4", Some(4000)),
            ("1500m", Some(1500)),
            ("1.5", Some(1500)),
            ("+1.5", Some(1500)),
            ("-1", Some(-1000)),
            ("-1.5", Some(-1500)),
            ("-0.0001", Some(-1)),
            ("0.0001", Some(1)),
            ("0.0000001", Some(1)),
            ("1n", Some(1)),
            ("1000000n", Some(1)),
            ("1000001n", Some(2)),
            ("1u", Some(1)),
            ("1000u", Some(1)),
            ("1k", Some(1_000_000)),
            ("1M", Some(1_000_000_000)),
            ("1G", Some(1_000_000_000_000)),
            ("1T", Some(1_000_000_000_000_000)),
            ("1P", Some(1_000_000_000_000_000_000)),
            ("1E", Some(i64::MAX)),
            ("1Ki", Some(1_024_000)),
            ("1.5Ki", Some(1_536_000)),
            ("0.1Ki", Some(102_400)),
            ("1Mi", Some(1_048_576_000)),
            ("1Gi", Some(1_073_741_824_000)),
            ("1Ti", Some(1_099_511_627_776_000)),
            ("1Pi", Some(1_125_899_906_842_624_000)),
            ("1Ei", Some(i64::MAX)),
            ("1e3", Some(1_000_000)),
            ("1E3", Some(1_000_000)),
            ("1e+3", Some(1_000_000)),
            ("1e-3", Some(1)),
            ("1.5e-3", Some(2)),
            ("12e-1", Some(1200)),
            ("1e400", Some(i64::MAX)),
            ("-1e400", Some(i64::MIN)),
            ("1e-400", Some(1)),
            ("1e9223372036854775807", Some(i64::MAX)),
            ("1e-9223372036854775808", Some(1)),
            ("1e9223372036854775808", None),
            ("0e400", Some(0)),
            ("000", Some(0)),
            ("-", Some(0)),
            ("+", Some(0)),
            (".", Some(0)),
            ("1.", Some(1000)),
            (".5", Some(500)),
            ("00.5m", Some(1)),
            ("123456789012345678901234567890", Some(i64::MAX)),
            ("0.000000000000000000000000000000000000000001", Some(1)),
            ("9223372036854775.807", Some(i64::MAX)),
            ("9223372036854775.806", Some(i64::MAX - 1)),
            (
                "99999999999999999999999999999999999999999999Ei",
                Some(i64::MAX),
            ),
            ("", None),
            // Upstream reads an empty numerator as 0.
            ("e3", Some(0)),
            ("Ki", Some(0)),
            ("+Ti", Some(0)),
            ("n", Some(0)),
            ("e-9", Some(0)),
            ("e-10", None),
            (".e-12", None),
            ("-Pi", None),
            ("Ei", None),
            ("0e-12", Some(0)),
            ("0Ei", Some(0)),
            ("1e", None),
            ("1Ki5", None),
            ("1K", None),
            ("1ki", None),
            ("1i", None),
            ("1 ", None),
            (" 1", None),
            ("1.2.3", None),
            ("1e3.5", None),
            ("1ee3", None),
            ("--1", None),
            ("1m1", None),
            ("∞", None),
            ("1é", None),
        ];
        for (input, want) in cases {
            assert_eq!(milli_value(input), *want, "{input:?}");
        }
    }

    #[test]
    fn parsing_never_panics() {
        let alphabet = [
            "0", "1", "9", ".", "-", "+", "e", "E", "i", "n", "m", "k", "K", "M", "x",
        ];
        // Every string up to length 4 over a small alphabet.
        let mut inputs = vec![String::new()];
        for _ in 0..4 {
            let next: Vec<String> = inputs
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            inputs.extend(next);
            inputs.dedup();
        }
        for s in &inputs {
            let _ = milli_value(s);
        }
        let long_digits = "9".repeat(10_000);
        assert_eq!(milli_value(&long_digits), Some(i64::MAX));
        assert_eq!(milli_value(&format!("0.{long_digits}")), Some(1000));
        assert_eq!(milli_value(&format!("{long_digits}Ei")), Some(i64::MAX));
        // 9.99…9 cores → 9 999 999 999.9… nano, rounded up to 10 cores.
        assert_eq!(milli_value(&format!("-{long_digits}e-9999")), Some(-10_000));
    }

    #[test]
    fn nano_to_milli_rounds_away_from_zero_and_saturates() {
        let cases: &[(i128, i64)] = &[
            (0, 0),
            (1, 1),
            (1_000_000, 1),
            (1_000_001, 2),
            (-1, -1),
            (-1_000_001, -2),
            (i128::MAX, i64::MAX),
            (i128::MIN, i64::MIN),
        ];
        for (nano, want) in cases {
            assert_eq!(nano_to_milli(*nano), *want, "{nano}");
        }
        assert_eq!(parse_nano(&"9".repeat(100)), Some(NANO_CAP));
        assert_eq!(parse_nano("-1.5Ki"), Some(-1_536_000_000_000));
        assert_eq!(parse_nano("1.0000000001"), Some(1_000_000_001));
    }
}
