//! Go's `encoding/json` output, byte for byte, where upstream hashes or compares the bytes it
//! marshals: the same value must give the same bytes here as in a Go controller.

use serde_json::{Number, Value};

/// `value` encoded as Go's `json.Marshal` encodes the `interface{}` that `json.Unmarshal` makes
/// of it: object members sorted by key in byte order at every depth, no whitespace, HTML-safe
/// string escaping, and every number printed as a float64 (Go decodes all numbers to float64,
/// so integers above 2^53 are rounded as Go rounds them).
pub fn marshal(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_float(out, as_float64(n)),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => {
            out.push(b'[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, e);
            }
            out.push(b']');
        }
        Value::Object(m) => {
            // Sorted here whatever serde_json's map order is (`preserve_order` may be on).
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, e)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, k);
                out.push(b':');
                write_value(out, e);
            }
            out.push(b'}');
        }
    }
}

/// The float64 Go's decoder makes of a JSON number. Integers convert with round-half-even, as
/// `strconv.ParseFloat` rounds their decimal text.
fn as_float64(n: &Number) -> f64 {
    if let Some(u) = n.as_u64() {
        u as f64
    } else if let Some(i) = n.as_i64() {
        i as f64
    } else {
        n.as_f64().unwrap_or(0.0)
    }
}

/// Go's float encoder (encoding/json floatEncoder, 64 bits): `strconv.AppendFloat(f, 'f', -1)`
/// for 1e-6 <= |f| < 1e21 (and 0), else `'e'` with the `e-0X` exponent shortened to `e-X`.
/// Both print the shortest digits that round-trip, as Rust's `{:e}` does.
fn write_float(out: &mut Vec<u8>, f: f64) {
    if !f.is_finite() {
        // Unreachable from JSON; Go would refuse to encode. Keep the output valid JSON.
        out.extend_from_slice(b"null");
        return;
    }
    if f.is_sign_negative() {
        out.push(b'-');
    }
    let abs = f.abs();
    if abs == 0.0 {
        out.push(b'0');
        return;
    }
    let (digits, exp) = shortest_digits(abs);
    if !(1e-6..1e21).contains(&abs) {
        out.push(digits.as_bytes()[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits.as_bytes()[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let e = exp.unsigned_abs();
        // Go prints at least two exponent digits, then undoes the padding for negative ones.
        if exp >= 0 && e < 10 {
            out.push(b'0');
        }
        out.extend_from_slice(e.to_string().as_bytes());
        return;
    }
    if exp < 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-exp - 1) as usize));
        out.extend_from_slice(digits.as_bytes());
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.extend_from_slice(digits.as_bytes());
            out.extend(std::iter::repeat_n(b'0', int_len - digits.len()));
        } else {
            out.extend_from_slice(&digits.as_bytes()[..int_len]);
            out.push(b'.');
            out.extend_from_slice(&digits.as_bytes()[int_len..]);
        }
    }
}

/// The shortest decimal digits that read back as `abs` (> 0), and the decimal exponent of the
/// first: `(d1d2..dn, e)` for d1.d2..dn × 10^e. Rust's `{:e}` gives shortest digits; when two
/// candidates of that length are equally close to the exact value it may pick either, where Go's
/// strconv (internal/strconv ftoadbox.go) rounds ties to even: the tie is settled here against
/// the exact expansion.
fn shortest_digits(abs: f64) -> (String, i32) {
    let split = |s: &str| -> (String, i32) {
        let (m, e) = s.split_once('e').expect("LowerExp prints an exponent");
        let digits: String = m.chars().filter(|c| *c != '.').collect();
        (digits, e.parse().expect("LowerExp exponent is an integer"))
    };
    let (digits, exp) = split(&format!("{abs:e}"));
    // Integers below 2^53 print all their digits: no tie is possible.
    if abs.fract() == 0.0 && abs < 9_007_199_254_740_992.0 {
        return (digits, exp);
    }
    // An f64 has at most 767 significant decimal digits: 800 is the exact expansion.
    let (exact, exact_exp) = split(&format!("{abs:.800e}"));
    let n = digits.len();
    if exact_exp != exp || exact.len() <= n {
        return (digits, exp);
    }
    let (head, rest) = exact.split_at(n);
    let tie = rest.starts_with('5') && rest[1..].bytes().all(|b| b == b'0');
    if !tie {
        return (digits, exp);
    }
    // The two candidates are `head` and `head` + 1 in the last place; keep the even one.
    let last = head.as_bytes()[n - 1] - b'0';
    let (even, even_exp) = if last.is_multiple_of(2) {
        (head.to_owned(), exp)
    } else {
        let mut d = head.as_bytes().to_vec();
        let mut i = n;
        loop {
            if i == 0 {
                d.insert(0, b'1');
                break;
            }
            i -= 1;
            if d[i] == b'9' {
                d[i] = b'0';
            } else {
                d[i] += 1;
                break;
            }
        }
        let carried = d.len() > n;
        d.truncate(n);
        (
            String::from_utf8(d).expect("digits"),
            if carried { exp + 1 } else { exp },
        )
    };
    let even = even.trim_end_matches('0').to_owned();
    let even = if even.is_empty() {
        "0".to_owned()
    } else {
        even
    };
    // Only a candidate that reads back as the same float is eligible (at a power of two the
    // rounding interval is lopsided).
    let text = format!("{}e{}", even, even_exp - (even.len() as i32 - 1));
    if text.parse::<f64>() == Ok(abs) {
        (even, even_exp)
    } else {
        (digits, exp)
    }
}

/// Go's `appendString` with `escapeHTML` (what `json.Marshal` uses): `"` `\` and the short
/// forms `\b \f \n \r \t` (Go 1.22+), other bytes below 0x20 and `< > &` as `\u00xx`, U+2028
/// and U+2029 as `\u2028` `\u2029`; everything else, DEL and non-ASCII included, verbatim.
fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc: Option<&[u8]> = match c {
            '"' => Some(b"\\\""),
            '\\' => Some(b"\\\\"),
            '\u{8}' => Some(b"\\b"),
            '\u{c}' => Some(b"\\f"),
            '\n' => Some(b"\\n"),
            '\r' => Some(b"\\r"),
            '\t' => Some(b"\\t"),
            '\u{2028}' => Some(b"\\u2028"),
            '\u{2029}' => Some(b"\\u2029"),
            _ => None,
        };
        let needs_hex = (c as u32) < 0x20 || matches!(c, '<' | '>' | '&');
        if esc.is_none() && !needs_hex {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match esc {
            Some(e) => out.extend_from_slice(e),
            None => {
                let b = c as u8;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
        }
        start = i + c.len_utf8();
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap()
    }

    #[test]
    fn escaping_and_numbers() {
        // Expected bytes printed by Go 1.26 encoding/json: json.Marshal of what json.Unmarshal
        // made of the input (the KCM 1.37.1 build uses Go 1.26, jsonv2 experiment off).
        let cases: &[(&str, &str)] = &[
            (
                r#"{"b":1,"a":"<>&\u2028\u2029\u0008\u000c\n\r\t\u0001\u001f\u007f é 😀"}"#,
                "{\"a\":\"\\u003c\\u003e\\u0026\\u2028\\u2029\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f} é 😀\",\"b\":1}",
            ),
            (r#"{"\"q\\":"/"}"#, r#"{"\"q\\":"/"}"#),
            (
                r#"{"é":1,"z":2,"Z":3,"a":{"y":[],"x":{}}}"#,
                r#"{"Z":3,"a":{"x":{},"y":[]},"z":2,"é":1}"#,
            ),
            (
                "[9007199254740993,9223372036854775807,-9223372036854775808,18446744073709551615,100,-658,0]",
                "[9007199254740992,9223372036854776000,-9223372036854776000,18446744073709552000,100,-658,0]",
            ),
            ("[true,false,null,\"\"]", "[true,false,null,\"\"]"),
        ];
        for (input, want) in cases {
            let v: Value = serde_json::from_str(input).unwrap();
            assert_eq!(s(&marshal(&v)), *want, "input {input}");
        }
        // Non-integers, read with Rust's correctly rounded parser (as Go's ParseFloat reads
        // them; serde_json without `float_roundtrip` may be one ulp off). The first two are
        // ties between two shortest candidates, which Go rounds to even.
        let floats = "993678314346769.25 1424558456169066.25 123456789012345678901234 0.000001 \
            1e-7 1.5e-10 0.1 1.7976931348623157e308 5e-324 -1e-7 1e300 2.5 -0.0 1e21 1e20 \
            -6.027510340171079e-9 272995275646483.12";
        let want = "[993678314346769.2,1424558456169066.2,1.2345678901234569e+23,0.000001,1e-7,\
            1.5e-10,0.1,1.7976931348623157e+308,5e-324,-1e-7,1e+300,2.5,-0,1e+21,\
            100000000000000000000,-6.027510340171079e-9,272995275646483.12]";
        let v = Value::Array(
            floats
                .split_whitespace()
                .map(|f| Value::from(f.parse::<f64>().unwrap()))
                .collect(),
        );
        assert_eq!(s(&marshal(&v)), want);
    }

    #[test]
    fn output_is_a_fixed_point() {
        // Callers compare marshal of what the API server served with bytes Go wrote: Go's own
        // output must come back unchanged.
        let data = "[9007199254740992,1e+21,1.5e-10,0.000001,-0.5]";
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(s(&marshal(&v)), data);
    }
}
