//! PostgreSQL array text (`{1,NULL,"a \"b\"",{2,3}}`) → a JSON array, for MySQL, which has
//! no array type.
//!
//! Only built-in array types are recognised, by OID: an array of a user-defined type (an enum
//! array, say) has an OID assigned at `CREATE TYPE` time that says nothing about its element,
//! so it travels as PostgreSQL's array text unchanged (documented in `docs/types.md`).
//! Elements of integer and float arrays become JSON numbers (non-finite floats become the
//! strings `"NaN"`, `"Infinity"`, `"-Infinity"`, as JSON has no such numbers), `boolean[]`
//! elements become `true`/`false`, NULL becomes `null`, and every other element becomes a
//! JSON string holding the element's PostgreSQL text. `numeric[]` elements are strings too:
//! MySQL stores a JSON number as a DOUBLE, which would round them.
//!
//! PostgreSQL quotes an element when it is empty, is `NULL` spelled out, or contains braces,
//! the delimiter, quotes, backslashes or white space; inside quotes `\` escapes the next
//! character (<https://www.postgresql.org/docs/15/arrays.html#ARRAYS-IO>).

use std::fmt::Write as _;

/// How the elements of a built-in array type are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    Number,
    Bool,
    Text,
}

/// The element kind of a built-in array type, or `None` when `type_oid` is not one.
fn element(type_oid: u32) -> Option<Element> {
    Some(match type_oid {
        // int2[], int4[], int8[], oid[], float4[], float8[]
        1005 | 1007 | 1016 | 1028 | 1021 | 1022 => Element::Number,
        // bool[]
        1000 => Element::Bool,
        // bytea[], "char"[], name[], text[], bpchar[], varchar[], numeric[], uuid[], json[],
        // jsonb[], date[], time[], timetz[], timestamp[], timestamptz[], interval[], inet[],
        // cidr[], macaddr[], money[], bit[], varbit[], xml[]
        1001 | 1002 | 1003 | 1009 | 1014 | 1015 | 1231 | 2951 | 199 | 3807 | 1182 | 1183 | 1270
        | 1115 | 1185 | 1187 | 1041 | 651 | 1040 | 791 | 1561 | 1563 | 143 => Element::Text,
        _ => return None,
    })
}

/// True when values of `type_oid` are written as JSON arrays.
pub(crate) fn is_builtin_array(type_oid: u32) -> bool {
    element(type_oid).is_some()
}

/// Appends the JSON array for PostgreSQL array text `text` of built-in array type `type_oid`.
/// Errors say what is malformed (the text may come from a transform).
pub(crate) fn push_json_array(out: &mut String, type_oid: u32, text: &str) -> Result<(), String> {
    let kind = element(type_oid)
        .ok_or_else(|| format!("type OID {type_oid} is not a built-in array type"))?;
    // Arrays with lower bounds other than 1 print their dimensions first: `[0:1]={1,2}`.
    let body = if text.starts_with('[') {
        text.split_once('=').map_or(text, |(_, b)| b)
    } else {
        text
    };
    let mut p = Parser {
        s: body.as_bytes(),
        pos: 0,
        kind,
        scratch: String::new(),
    };
    let parsed = match p.array(out) {
        Ok(()) if p.pos != p.s.len() => Err("text after the closing brace"),
        other => other,
    };
    parsed.map_err(|why| format!("malformed array value {:?}: {why}", shorten(text)))
}

fn shorten(text: &str) -> String {
    let mut s: String = text.chars().take(64).collect();
    if text.chars().nth(64).is_some() {
        s.push('…');
    }
    s
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    kind: Element,
    scratch: String,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn array(&mut self, out: &mut String) -> Result<(), &'static str> {
        if self.peek() != Some(b'{') {
            return Err("expected '{'");
        }
        self.pos += 1;
        out.push('[');
        if self.peek() == Some(b'}') {
            self.pos += 1;
            out.push(']');
            return Ok(());
        }
        loop {
            match self.peek() {
                Some(b'{') => self.array(out)?,
                Some(b'"') => {
                    self.quoted()?;
                    push_json_string(out, &self.scratch);
                }
                Some(_) => self.unquoted(out)?,
                None => return Err("unterminated array"),
            }
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    out.push(',');
                }
                Some(b'}') => {
                    self.pos += 1;
                    out.push(']');
                    return Ok(());
                }
                _ => return Err("expected ',' or '}' after an element"),
            }
        }
    }

    /// A quoted element into `scratch`, escapes resolved.
    fn quoted(&mut self) -> Result<(), &'static str> {
        self.pos += 1;
        let mut bytes = Vec::new();
        loop {
            match self.peek() {
                None => return Err("unterminated quoted element"),
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => {
                    let escaped = *self.s.get(self.pos + 1).ok_or("unterminated escape")?;
                    bytes.push(escaped);
                    self.pos += 2;
                }
                Some(b) => {
                    bytes.push(b);
                    self.pos += 1;
                }
            }
        }
        // Only ASCII bytes were removed from valid UTF-8, so this cannot fail.
        self.scratch = String::from_utf8(bytes).map_err(|_| "invalid UTF-8")?;
        Ok(())
    }

    fn unquoted(&mut self, out: &mut String) -> Result<(), &'static str> {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if matches!(b, b',' | b'}' | b'{' | b'"') {
                break;
            }
            self.pos += 1;
        }
        let raw = std::str::from_utf8(&self.s[start..self.pos]).map_err(|_| "invalid UTF-8")?;
        let raw = raw.trim();
        if raw.is_empty() {
            return Err("empty unquoted element");
        }
        if raw.eq_ignore_ascii_case("NULL") {
            out.push_str("null");
            return Ok(());
        }
        match self.kind {
            Element::Number if is_json_number(raw) => out.push_str(raw),
            Element::Bool => match raw {
                "t" | "true" => out.push_str("true"),
                "f" | "false" => out.push_str("false"),
                _ => return Err("boolean element is not t or f"),
            },
            _ => push_json_string(out, raw),
        }
        Ok(())
    }
}

/// JSON's number grammar (PostgreSQL prints `1e+30`, `-0`, `NaN`, `Infinity`; the last two
/// are not numbers and become strings).
fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let int_start = usize::from(b.first() == Some(&b'-'));
    let mut i = skip_digits(b, int_start);
    let int_len = i - int_start;
    if int_len == 0 || (int_len > 1 && b[int_start] == b'0') {
        return false;
    }
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = skip_digits(b, start);
        if i == start {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let start = i;
        i = skip_digits(b, start);
        if i == start {
            return false;
        }
    }
    i == b.len()
}

/// The index just past the run of ASCII digits that starts at `i`.
fn skip_digits(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// Appends `text` as a JSON string.
pub(crate) fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(oid: u32, text: &str) -> String {
        let mut out = String::new();
        push_json_array(&mut out, oid, text).unwrap_or_else(|e| panic!("{text}: {e}"));
        out
    }

    #[test]
    fn numbers_bools_and_nulls() {
        assert_eq!(json(1007, "{}"), "[]");
        assert_eq!(json(1007, "{1,-2,NULL}"), "[1,-2,null]");
        assert_eq!(json(1016, "{{1,2},{3,4}}"), "[[1,2],[3,4]]");
        assert_eq!(
            json(1022, "{1.5,1e+30,NaN,-Infinity}"),
            r#"[1.5,1e+30,"NaN","-Infinity"]"#
        );
        assert_eq!(json(1000, "{t,f,NULL}"), "[true,false,null]");
        assert_eq!(json(1007, "[0:1]={7,8}"), "[7,8]");
    }

    #[test]
    fn text_elements_are_unescaped_then_json_escaped() {
        assert_eq!(
            json(
                1009,
                r#"{plain,"with space","q\"uote","back\\slash","",NULL,"NULL"}"#
            ),
            r#"["plain","with space","q\"uote","back\\slash","",null,"NULL"]"#
        );
        assert_eq!(json(1009, "{żółw,🐢}"), r#"["żółw","🐢"]"#);
        assert_eq!(json(1009, "{\"tab\there\"}"), r#"["tab\there"]"#);
        // numeric[] stays exact as strings.
        assert_eq!(
            json(1231, "{123456789012345678901234567890.123456789,NaN}"),
            r#"["123456789012345678901234567890.123456789","NaN"]"#
        );
    }

    #[test]
    fn malformed_arrays_are_errors() {
        let mut out = String::new();
        for bad in ["", "{1,2", "{1,2}x", "{\"a}", "1,2", "{t,x}"] {
            let oid = if bad.contains('t') { 1000 } else { 1007 };
            out.clear();
            let e = push_json_array(&mut out, oid, bad).expect_err(bad);
            assert!(e.contains("malformed array"), "{e}");
        }
        assert!(!is_builtin_array(16_500));
    }

    #[test]
    fn json_numbers() {
        for ok in ["0", "-0", "12", "1.5", "1e+30", "-2.5E-3"] {
            assert!(is_json_number(ok), "{ok}");
        }
        for bad in ["", "-", "01", "1.", ".5", "NaN", "Infinity", "1e"] {
            assert!(!is_json_number(bad), "{bad}");
        }
    }
}
