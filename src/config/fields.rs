//! Typed reading of mapping fields from the interpolated `Value` tree, with located errors.
//!
//! This plays the role of `#[derive(Deserialize)] #[serde(deny_unknown_fields)]`, done by hand
//! because serde's errors from a `Value` carry neither a path nor a position, and because
//! values need coercion serde would refuse: after interpolation `port: "${PORT}"` is the
//! string `"5432"` and must still load as a number. Each reader knows its field path, so every
//! error becomes `file:line: path: message` through [`Ctx::err`].

use std::time::Duration;

use serde_yaml::{Mapping, Value};

use super::error::ConfigError;
use super::interpolate::key_text;
use super::locate::{LineIndex, child_key};

pub(crate) type Result<T> = std::result::Result<T, ConfigError>;

/// What every reader needs to locate an error.
pub(crate) struct Ctx<'a> {
    pub(crate) file: &'a str,
    pub(crate) index: &'a LineIndex,
}

impl Ctx<'_> {
    /// An error at `path`, on the line of `path` or of its nearest existing ancestor.
    pub(crate) fn err(&self, path: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, self.index.line(path), path, message)
    }

    /// The line of `path`, for messages that point at a second place.
    pub(crate) fn line(&self, path: &str) -> usize {
        self.index.line(path).unwrap_or(0)
    }
}

/// The fields of one YAML mapping.
pub(crate) struct Fields<'a> {
    ctx: &'a Ctx<'a>,
    path: String,
    map: &'a Mapping,
}

impl<'a> Fields<'a> {
    /// Views `value` (at `path`) as a mapping; `what` names it in the error otherwise.
    pub(crate) fn new(ctx: &'a Ctx<'a>, value: &'a Value, path: &str, what: &str) -> Result<Self> {
        match value {
            Value::Mapping(map) => Ok(Fields {
                ctx,
                path: path.to_owned(),
                map,
            }),
            other => Err(ctx.err(
                path,
                format!("expected {what} (a mapping), found {}", kind(other)),
            )),
        }
    }

    /// Rejects any key not in `known`, naming the first one in file order.
    pub(crate) fn deny_unknown(&self, known: &[&str]) -> Result<()> {
        for key in self.map.keys() {
            let name = key_text(key);
            if !matches!(key, Value::String(_)) || !known.contains(&name.as_str()) {
                return Err(self.ctx.err(
                    &self.field_path(&name),
                    format!(
                        "unknown field `{name}`; expected one of: {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn ctx(&self) -> &'a Ctx<'a> {
        self.ctx
    }

    /// The path of `key` inside this mapping.
    pub(crate) fn field_path(&self, key: &str) -> String {
        child_key(&self.path, key)
    }

    /// The value of `key`; an explicit null (`key:` or `key: ~`) counts as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Reads a field that must be present.
    pub(crate) fn required<T>(&self, key: &str, read: Reader<'_, T>) -> Result<T> {
        let path = self.field_path(key);
        match self.get(key) {
            Some(value) => read(self.ctx, &path, value),
            None => Err(self.ctx.err(&path, "required field is missing")),
        }
    }

    /// Reads a field that may be absent.
    pub(crate) fn optional<T>(&self, key: &str, read: Reader<'_, T>) -> Result<Option<T>> {
        let path = self.field_path(key);
        self.get(key).map(|v| read(self.ctx, &path, v)).transpose()
    }
}

/// Converts one located value.
pub(crate) type Reader<'r, T> = &'r dyn Fn(&Ctx<'_>, &str, &Value) -> Result<T>;

/// How a value's type is named in messages (never its content).
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A boolean: YAML `true`/`false`, or the strings `"true"`/`"false"` (what `${VAR}` yields).
pub(crate) fn boolean(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<bool> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s == "false" => Ok(s == "true"),
        other => Err(ctx.err(
            path,
            format!("expected true or false, found {}", kind(other)),
        )),
    }
}

/// A string. Numbers and booleans are refused rather than converted, because YAML has already
/// rewritten them (`0123` is the number 123, `yes` may be a boolean).
pub(crate) fn string(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(_) | Value::Bool(_) => Err(ctx.err(
            path,
            format!(
                "expected a string, found {}; quote the value so YAML keeps it as written",
                kind(value)
            ),
        )),
        other => Err(ctx.err(path, format!("expected a string, found {}", kind(other)))),
    }
}

/// A string that is not empty or blank.
pub(crate) fn non_empty(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = string(ctx, path, value)?;
    if s.trim().is_empty() {
        return Err(ctx.err(path, "must not be empty"));
    }
    Ok(s)
}

/// A pipeline or connector name: `[A-Za-z0-9_-]{1,63}`, because names end up in replication
/// slot, checkpoint and metric identifiers.
pub(crate) fn identifier(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<String> {
    let s = string(ctx, path, value)?;
    if s.is_empty() {
        return Err(ctx.err(path, "must not be empty"));
    }
    let valid = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid || s.len() > 63 {
        return Err(ctx.err(
            path,
            format!(
                "invalid name `{s}`: use 1 to 63 letters, digits, `-` and `_` \
                 (names are used in slot and checkpoint identifiers)"
            ),
        ));
    }
    Ok(s)
}

/// A whole number: a YAML integer, or a string of digits (what `"${VAR}"` yields).
pub(crate) fn whole(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<u64> {
    let parsed = match value {
        Value::Number(n) => n.as_u64().ok_or_else(|| n.to_string()),
        Value::String(s) => {
            let t = s.trim();
            if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                t.parse::<u64>().map_err(|_| t.to_owned())
            } else {
                Err(format!("`{t}`"))
            }
        }
        other => Err(kind(other).to_owned()),
    };
    parsed.map_err(|found| {
        ctx.err(
            path,
            format!("expected a non-negative whole number, found {found}"),
        )
    })
}

/// A whole number in `min..=max`.
pub(crate) fn ranged(ctx: &Ctx<'_>, path: &str, value: &Value, min: u64, max: u64) -> Result<u64> {
    let n = whole(ctx, path, value)?;
    if n < min || n > max {
        return Err(ctx.err(path, format!("must be between {min} and {max}, found {n}")));
    }
    Ok(n)
}

/// A TCP port, 1–65535.
pub(crate) fn port(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<u16> {
    let n = ranged(ctx, path, value, 1, u64::from(u16::MAX))?;
    Ok(u16::try_from(n).unwrap_or(u16::MAX))
}

/// A count that must be at least 1 and at most `max`.
pub(crate) fn positive<T: TryFrom<u64>>(max: u64) -> impl Fn(&Ctx<'_>, &str, &Value) -> Result<T> {
    move |ctx, path, value| {
        let n = ranged(ctx, path, value, 1, max)?;
        T::try_from(n).map_err(|_| ctx.err(path, format!("{n} is too large")))
    }
}

/// A retry count: 0 is allowed and means "no retries".
pub(crate) fn retries(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<u32> {
    let n = ranged(ctx, path, value, 0, u64::from(u32::MAX))?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// A positive duration written with a unit: `20ms`, `5s`, `1.5s`, `2m`, `1h`.
pub(crate) fn duration(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<Duration> {
    let parsed = match value {
        Value::String(s) => parse_duration(s),
        Value::Number(n) => Err(format!(
            "a duration needs a unit: write \"{n}s\" or \"{n}ms\" (units: ms, s, m, h)"
        )),
        other => Err(format!(
            "expected a duration such as \"20ms\" or \"5s\", found {}",
            kind(other)
        )),
    };
    parsed.map_err(|msg| ctx.err(path, msg))
}

/// A [`duration`] of at least `min`.
pub(crate) fn duration_at_least(
    min: Duration,
) -> impl Fn(&Ctx<'_>, &str, &Value) -> Result<Duration> {
    move |ctx, path, value| {
        let d = duration(ctx, path, value)?;
        if d < min {
            return Err(ctx.err(path, format!("must be at least {}", humantime_text(min))));
        }
        Ok(d)
    }
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
pub(crate) fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
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

/// A list, as a slice of its items.
pub(crate) fn list<'v>(ctx: &Ctx<'_>, path: &str, value: &'v Value) -> Result<&'v [Value]> {
    match value {
        Value::Sequence(items) => Ok(items),
        other => Err(ctx.err(path, format!("expected a list, found {}", kind(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_ctx<T>(yaml: &str, f: impl FnOnce(&Ctx<'_>, &Value) -> T) -> T {
        let index = LineIndex::build(yaml);
        let ctx = Ctx {
            file: "t.yaml",
            index: &index,
        };
        let value: Value = serde_yaml::from_str(yaml).unwrap();
        f(&ctx, &value)
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
        with_ctx("a: 20\nb: [1]\n", |ctx, v| {
            let e = duration(ctx, "a", &v["a"]).unwrap_err();
            assert_eq!(
                e.to_string(),
                "t.yaml:1: a: a duration needs a unit: write \"20s\" or \"20ms\" (units: ms, s, m, h)"
            );
            let e = duration(ctx, "b", &v["b"]).unwrap_err();
            assert_eq!(e.line(), Some(2));
            assert!(e.message().contains("found a list"));
        });
    }

    #[test]
    fn numbers_from_yaml_ints_and_digit_strings() {
        with_ctx(
            "a: 5432\nb: \"6543\"\nc: -1\nd: \"12x\"\ne: 1.5\nf: 70000\ng: 0\n",
            |ctx, v| {
                assert_eq!(port(ctx, "a", &v["a"]).unwrap(), 5432);
                assert_eq!(port(ctx, "b", &v["b"]).unwrap(), 6543);
                assert_eq!(
                    port(ctx, "c", &v["c"]).unwrap_err().to_string(),
                    "t.yaml:3: c: expected a non-negative whole number, found -1"
                );
                assert_eq!(
                    port(ctx, "d", &v["d"]).unwrap_err().to_string(),
                    "t.yaml:4: d: expected a non-negative whole number, found `12x`"
                );
                assert!(port(ctx, "e", &v["e"]).is_err());
                assert_eq!(
                    port(ctx, "f", &v["f"]).unwrap_err().to_string(),
                    "t.yaml:6: f: must be between 1 and 65535, found 70000"
                );
                assert!(port(ctx, "g", &v["g"]).is_err());
                assert_eq!(retries(ctx, "g", &v["g"]).unwrap(), 0);
                assert!(positive::<u32>(256)(ctx, "g", &v["g"]).is_err());
                assert_eq!(
                    positive::<u32>(256)(ctx, "a", &v["a"])
                        .unwrap_err()
                        .message(),
                    "must be between 1 and 256, found 5432"
                );
            },
        );
    }

    #[test]
    fn strings_refuse_numbers_with_a_hint() {
        with_ctx("a: 2024\nb: \"\"\nc: x\n", |ctx, v| {
            assert_eq!(
                string(ctx, "a", &v["a"]).unwrap_err().message(),
                "expected a string, found a number; quote the value so YAML keeps it as written"
            );
            assert_eq!(
                non_empty(ctx, "b", &v["b"]).unwrap_err().message(),
                "must not be empty"
            );
            assert_eq!(non_empty(ctx, "c", &v["c"]).unwrap(), "x");
        });
    }

    #[test]
    fn unknown_missing_and_null_fields() {
        with_ctx("m:\n  a: 1\n  b: ~\n  zz: 2\n", |ctx, v| {
            let f = Fields::new(ctx, &v["m"], "m", "a test map").unwrap();
            assert_eq!(
                f.deny_unknown(&["a", "b"]).unwrap_err().to_string(),
                "t.yaml:4: m.zz: unknown field `zz`; expected one of: a, b"
            );
            assert!(f.deny_unknown(&["a", "b", "zz"]).is_ok());
            assert_eq!(f.optional("b", &whole).unwrap(), None);
            assert_eq!(
                f.required("b", &whole).unwrap_err().to_string(),
                "t.yaml:3: m.b: required field is missing"
            );
            assert_eq!(
                f.required("c", &whole).unwrap_err().to_string(),
                "t.yaml:1: m.c: required field is missing"
            );
            assert_eq!(f.required("a", &whole).unwrap(), 1);
            let e = Fields::new(ctx, &v["m"]["a"], "m.a", "a test map")
                .err()
                .unwrap();
            assert_eq!(
                e.to_string(),
                "t.yaml:2: m.a: expected a test map (a mapping), found a number"
            );
        });
    }
}
