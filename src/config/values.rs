//! Field readers for `#[serde(deserialize_with = ...)]`: the value types of the file and their
//! checks, with the messages operators see.
//!
//! Values need coercion serde would refuse: after interpolation `port: "${PORT}"` is the string
//! `"5432"` and must still load as a number, and `"${FLAG}"` as a boolean. Errors name only a
//! value's type or a non-secret value, never a secret. Each reader's error is located at its
//! field by the deserializer.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Error as _, Visitor};

/// Any scalar, or the kind of a collection (whose content a reader does not want).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq,
    Map,
}

impl Scalar {
    /// How the value's type is named in messages (never its content).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Scalar::Null => "nothing",
            Scalar::Bool(_) => "a boolean",
            Scalar::Int(_) | Scalar::UInt(_) | Scalar::Float(_) => "a number",
            Scalar::Str(_) => "a string",
            Scalar::Seq => "a list",
            Scalar::Map => "a mapping",
        }
    }

    /// A number as written (`-1`, `1.5`), for messages.
    fn number_text(&self) -> Option<String> {
        match self {
            Scalar::Int(n) => Some(n.to_string()),
            Scalar::UInt(n) => Some(n.to_string()),
            Scalar::Float(f) => Some(f.to_string()),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::UInt(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_owned()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
                Ok(Scalar::Seq)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Scalar, A::Error> {
                Ok(Scalar::Map)
            }
        }
        d.deserialize_any(V)
    }
}

/// A string that is not empty or blank.
pub(crate) fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim().is_empty() {
        return Err(D::Error::custom("must not be empty"));
    }
    Ok(s)
}

/// A pipeline or connector name: `[A-Za-z0-9_-]{1,63}`, because names end up in replication
/// slot, checkpoint and metric identifiers.
pub(crate) fn identifier<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Err(D::Error::custom("must not be empty"));
    }
    let valid = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid || s.len() > 63 {
        return Err(D::Error::custom(format_args!(
            "invalid name `{s}`: use 1 to 63 letters, digits, `-` and `_` \
             (names are used in slot and checkpoint identifiers)"
        )));
    }
    Ok(s)
}

/// A boolean: YAML `true`/`false`, or the strings `"true"`/`"false"` (what `${VAR}` yields).
pub(crate) fn boolean<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Scalar::deserialize(d)? {
        Scalar::Bool(b) => Ok(b),
        Scalar::Str(s) if s == "true" || s == "false" => Ok(s == "true"),
        other => Err(D::Error::custom(format_args!(
            "expected true or false, found {}",
            other.kind()
        ))),
    }
}

/// A whole number: a YAML integer, or a string of digits (what `"${VAR}"` yields).
fn whole<E: de::Error>(value: Scalar) -> Result<u64, E> {
    let parsed = match &value {
        Scalar::UInt(n) => Ok(*n),
        Scalar::Int(n) => u64::try_from(*n).map_err(|_| n.to_string()),
        Scalar::Str(s) => {
            let t = s.trim();
            if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                t.parse::<u64>().map_err(|_| t.to_owned())
            } else {
                Err(format!("`{t}`"))
            }
        }
        other => Err(other
            .number_text()
            .unwrap_or_else(|| other.kind().to_owned())),
    };
    parsed.map_err(|found| {
        E::custom(format_args!(
            "expected a non-negative whole number, found {found}"
        ))
    })
}

/// A whole number in `min..=max`.
pub(crate) fn ranged<'de, D: Deserializer<'de>>(d: D, min: u64, max: u64) -> Result<u64, D::Error> {
    let n = whole(Scalar::deserialize(d)?)?;
    if n < min || n > max {
        return Err(D::Error::custom(format_args!(
            "must be between {min} and {max}, found {n}"
        )));
    }
    Ok(n)
}

/// A TCP port, 1–65535.
pub(crate) fn port<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    let n = ranged(d, 1, u64::from(u16::MAX))?;
    Ok(u16::try_from(n).unwrap_or(u16::MAX))
}

/// A retry count: 0 is allowed and means "no retries".
pub(crate) fn retries<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = ranged(d, 0, u64::from(u32::MAX))?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Upper bound for batch and queue sizes: far above any sane value, and fits `usize` on
/// 32-bit targets.
pub(crate) const COUNT_MAX: u64 = u32::MAX as u64;

/// A count from 1 to [`COUNT_MAX`].
pub(crate) fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, 1, COUNT_MAX)
}

/// A [`count`] held as `usize`.
pub(crate) fn count_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = count(d)?;
    usize::try_from(n).map_err(|_| D::Error::custom(format_args!("{n} is too large")))
}

/// A positive duration written with a unit: `20ms`, `5s`, `1.5s`, `2m`, `1h`.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let parsed = match Scalar::deserialize(d)? {
        Scalar::Str(s) => parse_duration(&s),
        number @ (Scalar::Int(_) | Scalar::UInt(_) | Scalar::Float(_)) => {
            let n = number.number_text().unwrap_or_default();
            Err(format!(
                "a duration needs a unit: write \"{n}s\" or \"{n}ms\" (units: ms, s, m, h)"
            ))
        }
        other => Err(format!(
            "expected a duration such as \"20ms\" or \"5s\", found {}",
            other.kind()
        )),
    };
    parsed.map_err(D::Error::custom)
}

/// An optional [`duration`].
pub(crate) fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// `1.5s`, `250ms`: how config errors print a duration.
pub(crate) fn humantime_text(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Parses `<number><unit>`; the number may have a fraction, the result must be above zero.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let bad = || {
        format!(
            "invalid duration `{s}`: expected a number and a unit (ms, s, m, h), e.g. \"20ms\", \"1.5s\""
        )
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = s.split_at(split);
    let unit_nanos: u128 = match unit.trim_start() {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty()
        || int.len() > 20
        || frac.contains('.')
        || (number.contains('.') && frac.is_empty())
    {
        return Err(bad());
    }
    let int: u128 = int.parse().map_err(|_| bad())?;
    // Exact decimal arithmetic (no floats): digits beyond nanosecond precision are dropped.
    let mut nanos = int * unit_nanos;
    let mut scale = unit_nanos;
    for digit in frac.bytes().take(18) {
        scale /= 10;
        nanos += u128::from(digit - b'0') * scale;
    }
    if nanos == 0 {
        return Err(format!("duration `{s}` must be greater than zero"));
    }
    let secs =
        u64::try_from(nanos / 1_000_000_000).map_err(|_| format!("duration `{s}` is too large"))?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A byte size: `64MiB`, `512KiB`, `1GiB`, `1MB`, or a plain number of bytes; above zero.
pub(crate) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let parsed = match Scalar::deserialize(d)? {
        Scalar::UInt(n) => Ok(n),
        number @ (Scalar::Int(_) | Scalar::Float(_)) => Err(format!(
            "invalid size {}",
            number.number_text().unwrap_or_default()
        )),
        Scalar::Str(s) => parse_size(&s),
        other => Err(format!(
            "expected a size such as \"64MiB\", found {}",
            other.kind()
        )),
    };
    match parsed {
        Ok(0) => Err(D::Error::custom("must be greater than zero")),
        Ok(n) => Ok(n),
        Err(msg) => Err(D::Error::custom(msg)),
    }
}

pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let bad = || {
        format!(
            "invalid size `{s}`: expected a whole number and a unit (B, KiB, MiB, GiB, KB, MB, GB), e.g. \"64MiB\""
        )
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// One of a fixed set of words (an enum's YAML spelling); `what` and `expected` word the
/// error: "unknown {what} `x`; expected {expected}".
pub(crate) fn keyword<'de, D: Deserializer<'de>, T: Copy>(
    d: D,
    choices: &[(&str, T)],
    what: &str,
    expected: &str,
) -> Result<T, D::Error> {
    let word = non_empty(d)?;
    choices
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            D::Error::custom(format_args!("unknown {what} `{word}`; expected {expected}"))
        })
}

/// PostgreSQL names are at most NAMEDATALEN - 1 = 63 bytes; the server truncates longer ones,
/// which would make Zipline address a different object than configured.
pub(crate) const PG_NAME_MAX: usize = 63;

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::super::deserializer::from_node;
    use super::super::tree::parse;
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(rename = "a test map")]
    struct Probe {
        #[serde(default, deserialize_with = "some_duration")]
        d: Option<Duration>,
        #[serde(default, deserialize_with = "port_opt")]
        p: Option<u16>,
        #[serde(default, deserialize_with = "retries_opt")]
        r: Option<u32>,
        #[serde(default, deserialize_with = "some_non_empty")]
        s: Option<String>,
        #[serde(default, deserialize_with = "lanes_opt")]
        l: Option<u64>,
    }

    fn some_non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        non_empty(d).map(Some)
    }
    fn port_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
        port(d).map(Some)
    }
    fn retries_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        retries(d).map(Some)
    }
    fn lanes_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        ranged(d, 1, 256).map(Some)
    }

    fn probe(yaml: &str) -> Result<Probe, String> {
        let root = parse("t.yaml", yaml).unwrap();
        from_node::<Probe>("t.yaml", &root).map_err(|e| e.to_string())
    }

    #[test]
    fn durations() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("20ms"), Duration::from_millis(20));
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok(" 0.25ms "), Duration::from_micros(250));
        assert_eq!(ok("10 s"), Duration::from_secs(10));
        for bad in [
            "5", "s", "1.s", ".5s", "1..5s", "5x", "-1s", "1e3s", "", "5sec",
        ] {
            assert!(
                parse_duration(bad)
                    .unwrap_err()
                    .starts_with("invalid duration"),
                "{bad}"
            );
        }
        assert!(
            parse_duration("0s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(
            parse_duration("0.0000000001s")
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(
            parse_duration("99999999999999999999h")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn duration_field_errors() {
        assert_eq!(
            probe("d: 20\n").unwrap_err(),
            "t.yaml:1: d: a duration needs a unit: write \"20s\" or \"20ms\" (units: ms, s, m, h)"
        );
        let e = probe("x: 1\nd: [1]\n").unwrap_err();
        assert!(
            e.starts_with("t.yaml:2: d: ") && e.contains("found a list"),
            "{e}"
        );
        assert_eq!(
            probe("d: 1.5s\n").unwrap().d,
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn numbers_from_yaml_ints_and_digit_strings() {
        assert_eq!(probe("p: 5432\n").unwrap().p, Some(5432));
        assert_eq!(probe("p: \"6543\"\n").unwrap().p, Some(6543));
        assert_eq!(
            probe("p: -1\n").unwrap_err(),
            "t.yaml:1: p: expected a non-negative whole number, found -1"
        );
        assert_eq!(
            probe("p: \"12x\"\n").unwrap_err(),
            "t.yaml:1: p: expected a non-negative whole number, found `12x`"
        );
        assert!(probe("p: 1.5\n").is_err());
        assert_eq!(
            probe("p: 70000\n").unwrap_err(),
            "t.yaml:1: p: must be between 1 and 65535, found 70000"
        );
        assert!(probe("p: 0\n").is_err());
        assert_eq!(probe("r: 0\n").unwrap().r, Some(0));
        assert!(probe("l: 0\n").is_err());
        assert_eq!(probe("l: 256\n").unwrap().l, Some(256));
        assert_eq!(
            probe("l: 5432\n").unwrap_err(),
            "t.yaml:1: l: must be between 1 and 256, found 5432"
        );
    }

    #[test]
    fn strings_refuse_numbers_with_a_hint() {
        assert_eq!(
            probe("s: 2024\n").unwrap_err(),
            "t.yaml:1: s: expected a string, found a number; quote the value so YAML keeps it as \
             written"
        );
        assert_eq!(
            probe("s: \" \"\n").unwrap_err(),
            "t.yaml:1: s: must not be empty"
        );
        assert_eq!(probe("s: x\n").unwrap().s.as_deref(), Some("x"));
        assert_eq!(
            probe("- 1\n").unwrap_err(),
            "t.yaml:1: expected a test map (a mapping), found a list"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1.5MiB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(
            parse_size("99999999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
    }
}
