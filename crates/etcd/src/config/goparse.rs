//! Go-compatible scalar parsing and formatting: the pieces of Go's `strconv`, `time` and
//! `encoding/json` whose exact behaviour (accepted syntax and error text) shows through
//! etcd's flag handling. Everything here is pure and table-tested.

use std::fmt::Write as _;

/// Why a Go `strconv` number parse failed (`strconv.ErrSyntax` / `strconv.ErrRange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumError {
    Syntax,
    Range,
}

impl NumError {
    /// The text Go's `flag` package reports for this failure (`numError` in flag.go).
    pub(crate) fn flag_text(self) -> &'static str {
        match self {
            NumError::Syntax => "parse error",
            NumError::Range => "value out of range",
        }
    }

    /// The text of the `*strconv.NumError` itself, e.g.
    /// `strconv.ParseUint: parsing "x": invalid syntax`.
    pub(crate) fn strconv_text(self, func: &str, input: &str) -> String {
        let why = match self {
            NumError::Syntax => "invalid syntax",
            NumError::Range => "value out of range",
        };
        format!("strconv.{func}: parsing {}: {why}", quote(input))
    }
}

/// Go's `strconv.Quote`: double-quoted, with Go escapes for control and non-printable runes.
pub(crate) fn quote(s: &str) -> String {
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
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                } else {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%q` applied to a `[]string`: `["a" "b"]`.
pub(crate) fn quote_list<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s.as_ref())).collect();
    format!("[{}]", quoted.join(" "))
}

/// The quoting the `time` package uses in its own errors: printable ASCII kept (with `"` and
/// `\` escaped), every byte of anything else written as `\xNN`.
fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if (c as u32) < 0x20 || (c as u32) >= 0x80 {
            let mut utf8 = [0u8; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                let _ = write!(out, "\\x{byte:02x}");
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

/// JSON string escaping as zap's JSON encoder does it (without the surrounding quotes).
pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `underscoreOK`: underscores may only separate digits (base-0 parsing only).
fn underscores_ok(s: &str) -> bool {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut body = bytes;
    if !body.is_empty() && (body[0] == b'-' || body[0] == b'+') {
        body = &body[1..];
    }
    // `saw`: b'^' start, b'0' digit or base prefix, b'_' underscore, b'!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    if body.len() >= 2
        && body[0] == b'0'
        && matches!(body[1].to_ascii_lowercase(), b'b' | b'o' | b'x')
    {
        i = 2;
        saw = b'0';
        hex = body[1].eq_ignore_ascii_case(&b'x');
    }
    while i < body.len() {
        let c = body[i];
        if c.is_ascii_digit() || (hex && c.to_ascii_lowercase().is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
        i += 1;
    }
    saw != b'_'
}

/// Go's `strconv.ParseUint(s, 0, bits)`: base prefixes `0x`, `0o`, `0b`, a bare leading `0`
/// for octal, and `_` digit separators.
pub(crate) fn parse_uint(s: &str, bits: u32) -> Result<u64, NumError> {
    if s.is_empty() {
        return Err(NumError::Syntax);
    }
    let bytes = s.as_bytes();
    let (base, digits): (u64, &[u8]) = if bytes[0] == b'0' {
        match bytes.get(1).map(u8::to_ascii_lowercase) {
            Some(b'b') if bytes.len() >= 3 => (2, &bytes[2..]),
            Some(b'o') if bytes.len() >= 3 => (8, &bytes[2..]),
            Some(b'x') if bytes.len() >= 3 => (16, &bytes[2..]),
            _ => (8, &bytes[1..]),
        }
    } else {
        (10, bytes)
    };
    let max_val: u64 = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let cutoff = u64::MAX / base + 1;
    let mut n: u64 = 0;
    let mut underscores = false;
    for &c in digits {
        let d = match c {
            b'_' => {
                underscores = true;
                continue;
            }
            b'0'..=b'9' => u64::from(c - b'0'),
            b'a'..=b'z' => u64::from(c - b'a') + 10,
            b'A'..=b'Z' => u64::from(c - b'A') + 10,
            _ => return Err(NumError::Syntax),
        };
        if d >= base {
            return Err(NumError::Syntax);
        }
        if n >= cutoff {
            return Err(NumError::Range);
        }
        n *= base;
        let n1 = n.wrapping_add(d);
        if n1 < n || n1 > max_val {
            return Err(NumError::Range);
        }
        n = n1;
    }
    if underscores && !underscores_ok(s) {
        return Err(NumError::Syntax);
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(s, 0, bits)`.
pub(crate) fn parse_int(s: &str, bits: u32) -> Result<i64, NumError> {
    if s.is_empty() {
        return Err(NumError::Syntax);
    }
    let (neg, body) = match s.as_bytes()[0] {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let un = parse_uint(body, bits)?;
    let cutoff: u64 = 1u64 << (bits.min(64) - 1);
    if !neg && un >= cutoff {
        return Err(NumError::Range);
    }
    if neg && un > cutoff {
        return Err(NumError::Range);
    }
    if neg {
        Ok((un as i64).wrapping_neg())
    } else {
        Ok(un as i64)
    }
}

/// A Go `time.Duration`: signed nanoseconds.
pub(crate) type GoDuration = i64;

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000;
const MILLISECOND: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

fn duration_unit(unit: &str) -> Option<u64> {
    match unit {
        "ns" => Some(NANOSECOND),
        "us" | "\u{b5}s" | "\u{3bc}s" => Some(MICROSECOND),
        "ms" => Some(MILLISECOND),
        "s" => Some(SECOND),
        "m" => Some(MINUTE),
        "h" => Some(HOUR),
        _ => None,
    }
}

/// Go's `time.ParseDuration`, including its error text
/// (`time: invalid duration "abc"`, `time: missing unit in duration "1"`, ...).
pub(crate) fn parse_duration(orig: &str) -> Result<GoDuration, String> {
    let invalid = || format!("time: invalid duration {}", time_quote(orig));
    let mut s = orig;
    let mut neg = false;
    if let Some(first) = s.chars().next().filter(|c| *c == '-' || *c == '+') {
        neg = first == '-';
        s = &s[1..];
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let first = s.as_bytes()[0];
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid());
        }
        // Leading integer.
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u64 = 0;
        for &c in &s.as_bytes()[..int_len] {
            if whole > (1u64 << 63) / 10 {
                return Err(invalid());
            }
            whole = whole * 10 + u64::from(c - b'0');
            if whole > 1u64 << 63 {
                return Err(invalid());
            }
        }
        let pre = int_len > 0;
        s = &s[int_len..];
        // Optional fraction.
        let mut frac: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut post = false;
        if s.as_bytes().first() == Some(&b'.') {
            s = &s[1..];
            let frac_len = s.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for &c in &s.as_bytes()[..frac_len] {
                if overflow {
                    continue;
                }
                if frac > ((1u64 << 63) - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let next = frac * 10 + u64::from(c - b'0');
                if next > 1u64 << 63 {
                    overflow = true;
                    continue;
                }
                frac = next;
                scale *= 10.0;
            }
            post = frac_len > 0;
            s = &s[frac_len..];
        }
        if !pre && !post {
            return Err(invalid());
        }
        // Unit.
        let unit_len = s
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(s.len(), |(i, _)| i);
        if unit_len == 0 {
            return Err(format!(
                "time: missing unit in duration {}",
                time_quote(orig)
            ));
        }
        let unit_text = &s[..unit_len];
        s = &s[unit_len..];
        let Some(unit) = duration_unit(unit_text) else {
            return Err(format!(
                "time: unknown unit {} in duration {}",
                time_quote(unit_text),
                time_quote(orig)
            ));
        };
        if whole > (1u64 << 63) / unit {
            return Err(invalid());
        }
        let mut value = whole * unit;
        if frac > 0 {
            value += (frac as f64 * (unit as f64 / scale)) as u64;
            if value > 1u64 << 63 {
                return Err(invalid());
            }
        }
        total += value;
        if total > 1u64 << 63 {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((total as i64).wrapping_neg());
    }
    if total > (1u64 << 63) - 1 {
        return Err(invalid());
    }
    Ok(total as i64)
}

/// Go's `time.Duration.String()`: `2h0m0s`, `1.5s`, `100ms`, `0s`.
pub(crate) fn duration_string(d: GoDuration) -> String {
    if d == 0 {
        return "0s".to_string();
    }
    let neg = d < 0;
    let u = d.unsigned_abs();
    let mut out = String::new();
    if u < SECOND {
        let (prec, unit) = if u < MICROSECOND {
            (0, "ns")
        } else if u < MILLISECOND {
            (3, "\u{b5}s")
        } else {
            (6, "ms")
        };
        let (int_part, frac) = split_frac(u, prec);
        out.push_str(&int_part.to_string());
        out.push_str(&frac);
        out.push_str(unit);
    } else {
        let (secs_total, frac) = split_frac(u, 9);
        let secs = secs_total % 60;
        let mins_total = secs_total / 60;
        if mins_total > 0 {
            let mins = mins_total % 60;
            let hours = mins_total / 60;
            if hours > 0 {
                let _ = write!(out, "{hours}h");
            }
            let _ = write!(out, "{mins}m");
        }
        let _ = write!(out, "{secs}{frac}s");
    }
    if neg {
        out.insert(0, '-');
    }
    out
}

/// Splits `v` into `v / 10^prec` and the fraction text (".5", trailing zeros dropped).
fn split_frac(v: u64, prec: u32) -> (u64, String) {
    let pow = 10u64.pow(prec);
    let int_part = v / pow;
    let frac = v % pow;
    if frac == 0 {
        return (int_part, String::new());
    }
    let digits = format!("{:0width$}", frac, width = prec as usize);
    (int_part, format!(".{}", digits.trim_end_matches('0')))
}

/// A Go duration as a `std::time::Duration`, negatives clamped to zero.
pub(crate) fn to_std_duration(d: GoDuration) -> std::time::Duration {
    std::time::Duration::from_nanos(u64::try_from(d).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint_parsing_follows_go_base_zero_rules() {
        let cases: &[(&str, Result<u64, NumError>)] = &[
            ("0", Ok(0)),
            ("100", Ok(100)),
            ("0x10", Ok(16)),
            ("0X1f", Ok(31)),
            ("010", Ok(8)),
            ("0o17", Ok(15)),
            ("0b101", Ok(5)),
            ("1_000", Ok(1000)),
            ("_1", Err(NumError::Syntax)),
            ("1__0", Err(NumError::Syntax)),
            ("", Err(NumError::Syntax)),
            ("-1", Err(NumError::Syntax)),
            ("+1", Err(NumError::Syntax)),
            ("08", Err(NumError::Syntax)),
            ("0x", Err(NumError::Syntax)),
            ("1e3", Err(NumError::Syntax)),
            ("18446744073709551615", Ok(u64::MAX)),
            ("18446744073709551616", Err(NumError::Range)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_uint(input, 64), *want, "input {input:?}");
        }
        assert_eq!(parse_uint("4294967295", 32), Ok(4_294_967_295));
        assert_eq!(parse_uint("4294967296", 32), Err(NumError::Range));
    }

    #[test]
    fn int_parsing_handles_signs_and_range() {
        assert_eq!(parse_int("-5", 64), Ok(-5));
        assert_eq!(parse_int("+5", 64), Ok(5));
        assert_eq!(parse_int("-0x10", 64), Ok(-16));
        assert_eq!(parse_int("9223372036854775807", 64), Ok(i64::MAX));
        assert_eq!(parse_int("9223372036854775808", 64), Err(NumError::Range));
        assert_eq!(parse_int("-9223372036854775808", 64), Ok(i64::MIN));
        assert_eq!(parse_int("abc", 64), Err(NumError::Syntax));
        assert_eq!(parse_int("-", 64), Err(NumError::Syntax));
    }

    #[test]
    fn bools_accept_exactly_gos_spellings() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(yes), Some(true));
        }
        for no in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(no), Some(false));
        }
        for bad in ["yes", "tRUE", "", "on"] {
            assert_eq!(parse_bool(bad), None);
        }
    }

    #[test]
    fn durations_parse_and_print_like_go() {
        let ok: &[(&str, i64)] = &[
            ("0", 0),
            ("-0", 0),
            ("5s", 5_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("100ms", 100_000_000),
            ("-2m", -120_000_000_000),
            ("1us", 1000),
            ("1\u{b5}s", 1000),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
        ];
        for (input, want) in ok {
            assert_eq!(parse_duration(input), Ok(*want), "input {input:?}");
        }
        assert_eq!(
            parse_duration("abc").unwrap_err(),
            r#"time: invalid duration "abc""#
        );
        assert_eq!(
            parse_duration("5").unwrap_err(),
            r#"time: missing unit in duration "5""#
        );
        assert_eq!(
            parse_duration("-1").unwrap_err(),
            r#"time: missing unit in duration "-1""#
        );
        assert_eq!(
            parse_duration("3x").unwrap_err(),
            r#"time: unknown unit "x" in duration "3x""#
        );
        assert_eq!(
            parse_duration("").unwrap_err(),
            r#"time: invalid duration """#
        );
        assert_eq!(
            parse_duration(".s").unwrap_err(),
            r#"time: invalid duration ".s""#
        );

        let printed: &[(i64, &str)] = &[
            (0, "0s"),
            (5_000_000_000, "5s"),
            (7_200_000_000_000, "2h0m0s"),
            (60_000_000_000, "1m0s"),
            (100_000_000, "100ms"),
            (1_500_000_000, "1.5s"),
            (1_500, "1.5\u{b5}s"),
            (7, "7ns"),
            (-20_000_000_000, "-20s"),
        ];
        for (d, want) in printed {
            assert_eq!(duration_string(*d), *want);
        }
    }

    #[test]
    fn quoting_matches_go() {
        assert_eq!(quote("abc"), r#""abc""#);
        assert_eq!(quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(quote("a\nb\u{1}"), r#""a\nb\x01""#);
        assert_eq!(quote("héllo"), "\"héllo\"");
        assert_eq!(quote_list(&["a", "b"]), r#"["a" "b"]"#);
        assert_eq!(
            NumError::Range.strconv_text("ParseUint", "99999999999"),
            r#"strconv.ParseUint: parsing "99999999999": value out of range"#
        );
    }
}
