//! Numbers and equality as JSON Schema means them: by value (`1 == 1.0`), exactly across
//! integers and floats, and `multipleOf` in the decimals the numbers are written in.

use std::cmp::Ordering;

use serde_json::{Number, Value};

pub(super) fn is_integer(n: &Number) -> bool {
    n.is_u64() || n.is_i64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn as_int(n: &Number) -> Option<i128> {
    n.as_u64()
        .map(i128::from)
        .or_else(|| n.as_i64().map(i128::from))
}

/// The exact order of two JSON numbers: integers and floats are compared by value, never
/// through a rounding to `f64`.
pub(super) fn cmp_numbers(a: &Number, b: &Number) -> Ordering {
    match (as_int(a), as_int(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(x), None) => cmp_int_float(x, b.as_f64().unwrap_or(0.0)),
        (None, Some(y)) => cmp_int_float(y, a.as_f64().unwrap_or(0.0)).reverse(),
        (None, None) => {
            let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

fn cmp_int_float(i: i128, f: f64) -> Ordering {
    // 2^127: beyond every i128 (JSON numbers are finite).
    const LIMIT: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f >= LIMIT {
        return Ordering::Less;
    }
    if f < -LIMIT {
        return Ordering::Greater;
    }
    let whole = f.trunc();
    // Exact: `whole` is an integer of magnitude below 2^127.
    match i.cmp(&(whole as i128)) {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal),
        other => other,
    }
}

pub(super) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => cmp_numbers(x, y) == Ordering::Equal,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q)))
        }
        _ => a == b,
    }
}

/// `multipleOf`: whether `n / d` is a whole number, reading both as the decimals they are
/// written as (`0.3 / 0.1 = 3`), as JSON Schema means them; exact for integers.
pub(super) fn is_multiple_of(n: &Number, d: f64) -> bool {
    const SAFE: f64 = 9_007_199_254_740_992.0; // 2^53
    let Some(v) = n.as_f64() else { return false };
    if d.fract() == 0.0 {
        // A whole divisor: integers divide exactly; a float must be whole, and `%` on whole
        // floats is exact.
        if d <= SAFE
            && let Some(i) = as_int(n)
        {
            return i % (d as i128) == 0;
        }
        return v.fract() == 0.0 && v % d == 0.0;
    }
    if v == 0.0 {
        return true;
    }
    if v.abs() < d {
        return false;
    }
    match (decimal_parts(v), decimal_parts(d)) {
        (Some(a), Some(b)) => decimal_divides(a, b).unwrap_or_else(|| binary_divides(v, d)),
        _ => binary_divides(v, d),
    }
}

/// A finite `f64` as the shortest decimal that reads back as it: `(mantissa, decimals)` for
/// `mantissa / 10^decimals`.
fn decimal_parts(x: f64) -> Option<(i128, i32)> {
    let text = format!("{x:e}");
    let (digits, exp) = text.split_once('e')?;
    let exp: i32 = exp.parse().ok()?;
    let negative = digits.starts_with('-');
    let digits = digits.trim_start_matches('-');
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let mantissa: i128 = format!("{whole}{frac}").parse().ok()?;
    let decimals = i32::try_from(frac.len()).ok()? - exp;
    Some((if negative { -mantissa } else { mantissa }, decimals))
}

/// `(a / 10^da) / (b / 10^db)` is whole; `None` when the scaled mantissas leave `i128`.
fn decimal_divides((a, da): (i128, i32), (b, db): (i128, i32)) -> Option<bool> {
    if b == 0 {
        return None;
    }
    let shared = da.min(db);
    let scale =
        |m: i128, places: i32| m.checked_mul(10i128.checked_pow(u32::try_from(places).ok()?)?);
    let num = scale(a, db - shared)?;
    let den = scale(b, da - shared)?;
    Some(num % den == 0)
}

/// Whether `v / d` is whole in binary: `v = a·2^p`, `d = b·2^q` with `a`, `b` odd, so the
/// quotient is whole exactly when `b` divides `a` and `p ≥ q`.
fn binary_divides(v: f64, d: f64) -> bool {
    let (a, p) = odd_mantissa(v.abs());
    let (b, q) = odd_mantissa(d.abs());
    p >= q && a % b == 0
}

fn odd_mantissa(x: f64) -> (u64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    let (m, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp - 1075)
    };
    if m == 0 {
        return (0, 0);
    }
    let tz = m.trailing_zeros();
    (m >> tz, e + tz as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exact_order_decimals_and_binary_division() {
        let n = |v: Value| match v {
            Value::Number(n) => n,
            _ => unreachable!(),
        };
        assert_eq!(cmp_numbers(&n(json!(1)), &n(json!(1.0))), Ordering::Equal);
        assert_eq!(cmp_numbers(&n(json!(-1)), &n(json!(-0.5))), Ordering::Less);
        assert_eq!(
            cmp_numbers(&n(json!(-1)), &n(json!(-1.5))),
            Ordering::Greater
        );
        assert_eq!(
            cmp_numbers(&n(json!(u64::MAX)), &n(json!(1e300))),
            Ordering::Less
        );
        assert_eq!(
            cmp_numbers(&n(json!(i64::MIN)), &n(json!(-1e300))),
            Ordering::Greater
        );
        assert_eq!(cmp_numbers(&n(json!(0.1)), &n(json!(0.2))), Ordering::Less);
        assert_eq!(decimal_parts(0.1), Some((1, 1)));
        assert_eq!(decimal_parts(-2.5e3), Some((-25, -2)));
        assert_eq!(decimal_parts(1070468.14), Some((107046814, 2)));
        assert!(binary_divides(1.5, 0.5));
        assert!(!binary_divides(0.75, 0.5));
        assert!(binary_divides(1e300, 0.25));
    }
}
