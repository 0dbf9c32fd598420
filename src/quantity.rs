//! Memory quantities as users write them (`1205Mi`, `6GiB`, `1.5Gi`, `25%`) and durations
//! (`90s`, `5m`, `1h`).
//!
//! Parsing is exact integer arithmetic on the decimal digits: `1.5Gi` is 1,610,612,736 bytes
//! on every host, with no float rounding. A fraction of a byte rounds up, so a request is never
//! silently made smaller than what was asked.

use std::fmt;
use std::time::Duration;

/// A memory amount as requested: absolute bytes, or a share of each GPU's total memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    Bytes(u64),
    /// Parts per million of the GPU's total memory (`25%` is 250,000), so percentages with
    /// decimals stay exact integers.
    PartsPerMillion(u32),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("{value:?} is empty: write an amount such as 1205Mi, 6GiB or 25%")]
    Empty { value: String },
    #[error("{value:?} is not a number with a unit: write an amount such as 1205Mi, 6GiB, 1.5Gi or 25%")]
    Malformed { value: String },
    #[error("{value:?} has unknown unit {unit:?}: use B, Ki, Mi, Gi, Ti (powers of 1024, optionally with a trailing B) or K, M, G, T (powers of 1000)")]
    UnknownUnit { value: String, unit: String },
    #[error("{value:?} is zero: a request must be at least one byte")]
    Zero { value: String },
    #[error("{value:?} is negative: a request must be a positive amount")]
    Negative { value: String },
    #[error("{value:?} is too large to be a memory amount (more than 16 EiB)")]
    Overflow { value: String },
    #[error("{value:?} is not a share of the GPU: a percentage must be above 0% and at most 100%")]
    PercentOutOfRange { value: String },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("{value:?} is not a duration: write a whole number with a unit, such as 500ms, 90s, 5m or 1h")]
    Malformed { value: String },
    #[error("{value:?} is too long a duration: the longest is 168h (a week)")]
    Overflow { value: String },
}

/// The longest duration vramgate accepts anywhere (timeouts, intervals, bounds): a week. No
/// container start should wait longer, and with the bound `now + duration` in milliseconds
/// can never overflow, whatever an annotation says.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest input we look at. A real quantity is a handful of characters; a long string is
/// refused before any arithmetic so a hostile annotation costs nothing.
const MAX_INPUT_LEN: usize = 64;

impl Quantity {
    /// The bytes this quantity means on a GPU with `total` bytes of memory (percentages round up).
    pub fn bytes_on(self, total: u64) -> u64 {
        match self {
            Quantity::Bytes(bytes) => bytes,
            Quantity::PartsPerMillion(ppm) => {
                let bytes = (u128::from(total) * u128::from(ppm)).div_ceil(1_000_000);
                u64::try_from(bytes).unwrap_or(u64::MAX)
            }
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Quantity::Bytes(bytes) => f.write_str(&format_bytes(bytes)),
            Quantity::PartsPerMillion(ppm) => {
                let whole = ppm / 10_000;
                let frac = ppm % 10_000;
                if frac == 0 {
                    write!(f, "{whole}%")
                } else {
                    let frac = format!("{frac:04}");
                    write!(f, "{whole}.{}%", frac.trim_end_matches('0'))
                }
            }
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
    }
}

/// A decimal number split into its digits: `12.50` is mantissa 1250 with 2 fractional digits.
struct Decimal {
    mantissa: u128,
    frac_digits: u32,
}

fn parse_decimal(number: &str) -> Option<Decimal> {
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int_part) || !all_digits(frac_part) || (number.contains('.') && frac_part.is_empty()) {
        return None;
    }
    // Trailing fractional zeros carry no value; dropping them keeps the mantissa small.
    let frac_part = frac_part.trim_end_matches('0');
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    Some(Decimal {
        mantissa,
        frac_digits: frac_part.len() as u32,
    })
}

fn unit_multiplier(unit: &str) -> Option<u128> {
    const KI: u128 = 1 << 10;
    Some(match unit {
        "" | "B" => 1,
        "Ki" | "KiB" => KI,
        "Mi" | "MiB" => KI.pow(2),
        "Gi" | "GiB" => KI.pow(3),
        "Ti" | "TiB" => KI.pow(4),
        "k" | "K" | "kB" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        _ => return None,
    })
}

/// Parses a memory quantity. Zero, negative and overflowing amounts are errors that name the
/// value; whether an amount is more than a GPU holds is decided later, against the inventory.
pub fn parse_quantity(input: &str) -> Result<Quantity, QuantityError> {
    let value = input.trim();
    let err_value = || input.chars().take(MAX_INPUT_LEN).collect::<String>();
    if value.is_empty() {
        return Err(QuantityError::Empty { value: err_value() });
    }
    if value.len() > MAX_INPUT_LEN {
        return Err(QuantityError::Malformed { value: err_value() });
    }
    if value.starts_with('-') {
        return Err(QuantityError::Negative { value: err_value() });
    }
    let value = value.strip_prefix('+').unwrap_or(value);
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let unit = unit.trim_start();
    let decimal = parse_decimal(number).ok_or_else(|| QuantityError::Malformed { value: err_value() })?;

    if unit == "%" {
        // Parts per million: percent * 10^4, with up to 4 fractional digits kept exactly.
        let scale = 10u128.pow(4);
        let denom = 10u128.pow(decimal.frac_digits.min(30));
        if decimal.frac_digits > 30 {
            return Err(QuantityError::Malformed { value: err_value() });
        }
        let ppm = (decimal
            .mantissa
            .checked_mul(scale)
            .ok_or_else(|| QuantityError::PercentOutOfRange { value: err_value() })?)
        .div_ceil(denom);
        if decimal.mantissa == 0 {
            return Err(QuantityError::Zero { value: err_value() });
        }
        if ppm == 0 || ppm > 1_000_000 {
            return Err(QuantityError::PercentOutOfRange { value: err_value() });
        }
        return Ok(Quantity::PartsPerMillion(ppm as u32));
    }

    let multiplier = unit_multiplier(unit).ok_or_else(|| QuantityError::UnknownUnit {
        value: err_value(),
        unit: unit.to_string(),
    })?;
    if decimal.mantissa == 0 {
        return Err(QuantityError::Zero { value: err_value() });
    }
    if decimal.frac_digits > 30 {
        return Err(QuantityError::Malformed { value: err_value() });
    }
    let scaled = decimal
        .mantissa
        .checked_mul(multiplier)
        .ok_or_else(|| QuantityError::Overflow { value: err_value() })?;
    let bytes = scaled.div_ceil(10u128.pow(decimal.frac_digits));
    let bytes = u64::try_from(bytes).map_err(|_| QuantityError::Overflow { value: err_value() })?;
    Ok(Quantity::Bytes(bytes))
}

/// Parses a duration such as `500ms`, `90s`, `5m`, `1h` or `0s`.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let value = input.trim();
    let malformed = || DurationError::Malformed {
        value: input.chars().take(MAX_INPUT_LEN).collect(),
    };
    if value.is_empty() || value.len() > MAX_INPUT_LEN {
        return Err(malformed());
    }
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    if number.is_empty() {
        return Err(malformed());
    }
    let n: u64 = number.parse().map_err(|_| DurationError::Overflow {
        value: input.chars().take(MAX_INPUT_LEN).collect(),
    })?;
    let millis_per_unit: u64 = match unit.trim_start() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(malformed()),
    };
    let too_long = || DurationError::Overflow {
        value: input.chars().take(MAX_INPUT_LEN).collect(),
    };
    let millis = n.checked_mul(millis_per_unit).ok_or_else(too_long)?;
    if millis > MAX_DURATION.as_millis() as u64 {
        return Err(too_long());
    }
    Ok(Duration::from_millis(millis))
}

/// Formats a duration the way `parse_duration` reads it back, at the coarsest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else if ms >= 10_000 {
        format!("{:.0}s", d.as_secs_f64())
    } else if ms >= 1_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

/// Formats bytes for people: MiB below 10 GiB (the unit GPU tools print), GiB above.
pub fn format_bytes(bytes: u64) -> String {
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    const TI: u64 = 1 << 40;
    if bytes >= 10 * TI {
        format!("{:.1} TiB", bytes as f64 / TI as f64)
    } else if bytes >= 10 * GI {
        format!("{:.1} GiB", bytes as f64 / GI as f64)
    } else if bytes >= MI {
        let mib = bytes as f64 / MI as f64;
        if bytes % MI == 0 {
            format!("{} MiB", bytes / MI)
        } else {
            format!("{mib:.1} MiB")
        }
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn accepts_every_documented_form() {
        let cases: &[(&str, u64)] = &[
            ("1205Mi", 1205 * MI),
            ("1205MiB", 1205 * MI),
            ("6Gi", 6 * GI),
            ("6GiB", 6 * GI),
            ("6G", 6_000_000_000),
            ("6GB", 6_000_000_000),
            ("512Ki", 512 * 1024),
            ("512KiB", 512 * 1024),
            ("1048576", MI),
            ("1048576B", MI),
            ("1.5Gi", 1_610_612_736),
            ("0.5Mi", MI / 2),
            (" 2Gi ", 2 * GI),
            ("2 Gi", 2 * GI),
            ("+3Mi", 3 * MI),
            ("1.50Gi", 1_610_612_736),
            ("1Ti", 1 << 40),
            ("2T", 2_000_000_000_000),
            ("7k", 7000),
        ];
        for (input, bytes) in cases {
            assert_eq!(parse_quantity(input), Ok(Quantity::Bytes(*bytes)), "{input}");
        }
    }

    #[test]
    fn fractions_of_a_byte_round_up() {
        assert_eq!(parse_quantity("0.1"), Ok(Quantity::Bytes(1)));
        assert_eq!(parse_quantity("1.0001Ki"), Ok(Quantity::Bytes(1025)));
    }

    #[test]
    fn percentages_are_exact() {
        assert_eq!(parse_quantity("25%"), Ok(Quantity::PartsPerMillion(250_000)));
        assert_eq!(parse_quantity("12.5%"), Ok(Quantity::PartsPerMillion(125_000)));
        assert_eq!(parse_quantity("100%"), Ok(Quantity::PartsPerMillion(1_000_000)));
        assert_eq!(
            Quantity::PartsPerMillion(500_000).bytes_on(24_265 * MI),
            24_265 * MI / 2
        );
        assert_eq!(Quantity::PartsPerMillion(1).bytes_on(3), 1, "rounds up");
        assert_eq!(Quantity::PartsPerMillion(125_000).to_string(), "12.5%");
    }

    #[test]
    fn rejects_bad_values_naming_them() {
        let cases: &[(&str, fn(&QuantityError) -> bool)] = &[
            ("", |e| matches!(e, QuantityError::Empty { .. })),
            ("   ", |e| matches!(e, QuantityError::Empty { .. })),
            ("0", |e| matches!(e, QuantityError::Zero { .. })),
            ("0Gi", |e| matches!(e, QuantityError::Zero { .. })),
            ("0.0Mi", |e| matches!(e, QuantityError::Zero { .. })),
            ("-1Gi", |e| matches!(e, QuantityError::Negative { .. })),
            ("1Gb", |e| matches!(e, QuantityError::UnknownUnit { .. })),
            ("1mi", |e| matches!(e, QuantityError::UnknownUnit { .. })),
            ("5 apples", |e| matches!(e, QuantityError::UnknownUnit { .. })),
            ("Gi", |e| matches!(e, QuantityError::Malformed { .. })),
            ("1.2.3Gi", |e| matches!(e, QuantityError::Malformed { .. })),
            ("1.Gi", |e| matches!(e, QuantityError::Malformed { .. })),
            ("1e9", |e| matches!(e, QuantityError::UnknownUnit { .. })),
            ("NaN", |e| matches!(e, QuantityError::Malformed { .. })),
            ("99999999999999999999Ti", |e| {
                matches!(e, QuantityError::Overflow { .. })
            }),
            ("18446744073709551616", |e| matches!(e, QuantityError::Overflow { .. })),
            ("0%", |e| matches!(e, QuantityError::Zero { .. })),
            ("101%", |e| matches!(e, QuantityError::PercentOutOfRange { .. })),
            ("-5%", |e| matches!(e, QuantityError::Negative { .. })),
        ];
        for (input, expected) in cases {
            let err = parse_quantity(input).expect_err(input);
            assert!(expected(&err), "{input}: {err:?}");
            let message = err.to_string();
            assert!(
                message.contains(&format!("{:?}", input.chars().take(64).collect::<String>())),
                "{message}"
            );
        }
    }

    #[test]
    fn long_input_is_refused_without_work() {
        let long = "9".repeat(10_000);
        assert!(matches!(parse_quantity(&long), Err(QuantityError::Malformed { .. })));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "s", "5", "5d", "-5s", "1.5s", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn durations_are_bounded_so_deadlines_cannot_overflow() {
        assert_eq!(parse_duration("168h"), Ok(MAX_DURATION));
        for too_long in ["169h", "10081m", "604800001ms", "18446744073709551615ms"] {
            let err = parse_duration(too_long).unwrap_err().to_string();
            assert!(err.contains("the longest is 168h"), "{too_long}: {err}");
        }
    }

    #[test]
    fn formats_bytes_for_people() {
        assert_eq!(format_bytes(1205 * MI), "1205 MiB");
        assert_eq!(format_bytes(24_265 * MI), "23.7 GiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(100 << 40), "100.0 TiB");
    }
}
