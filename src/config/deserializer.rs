//! serde deserialization of the typed model from the located tree, with located errors.
//!
//! The model's types derive `Deserialize` (`#[serde(deny_unknown_fields)]`, defaults, field
//! readers from `values`); this deserializer feeds them [`Node`]s and pins every error to the
//! innermost node it arose in, so it prints as `file:line: path: message`. serde's stock
//! messages are replaced by the ones operators know (`required field is missing`, `unknown field
//! `x`; expected one of: ...`). An explicit null counts as an absent field.

use std::fmt;

use serde::de::{self, DeserializeSeed, Error as _, IntoDeserializer, Unexpected, Visitor};

use super::error::ConfigError;
use super::tree::{Node, Value, child_key};

/// A deserialization error, located once by the innermost node that saw it.
#[derive(Debug)]
pub(crate) struct DeError {
    /// `(path, line)` once located.
    at: Option<(String, usize)>,
    /// A missing field's name: the error is at that field of the node that locates it.
    missing: Option<&'static str>,
    message: String,
}

impl DeError {
    /// Pins the error to `node` unless an inner node already did.
    pub(crate) fn at(mut self, node: &Node) -> Self {
        if self.at.is_none() {
            let path = match self.missing {
                Some(field) => child_key(&node.path, field),
                None => node.path.clone(),
            };
            self.at = Some((path, node.line));
        }
        self
    }

    /// The error as the operator sees it.
    pub(crate) fn into_config(self, file: &str) -> ConfigError {
        let (path, line) = self.at.unwrap_or_default();
        ConfigError::new(file, Some(line).filter(|&l| l > 0), path, self.message)
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            at: None,
            missing: None,
            message: msg.to_string(),
        }
    }

    fn invalid_type(unexp: Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        let found = match unexp {
            Unexpected::Bool(_) => "a boolean",
            Unexpected::Unsigned(_) | Unexpected::Signed(_) | Unexpected::Float(_) => "a number",
            Unexpected::Str(_) | Unexpected::Char(_) => "a string",
            Unexpected::Unit | Unexpected::Option => "nothing",
            Unexpected::Seq => "a list",
            Unexpected::Map => "a mapping",
            _ => "another kind of value",
        };
        DeError::custom(format_args!("expected {exp}, found {found}"))
    }

    fn missing_field(field: &'static str) -> Self {
        DeError {
            at: None,
            missing: Some(field),
            message: "required field is missing".to_owned(),
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError::custom(format_args!(
            "unknown field `{field}`; expected one of: {}",
            expected.join(", ")
        ))
    }
}

/// Deserializes `T` from `node`, as `file` labels it.
pub(crate) fn from_node<'a, T: serde::Deserialize<'a>>(
    file: &str,
    node: &'a Node,
) -> Result<T, ConfigError> {
    T::deserialize(node).map_err(|e| e.at(node).into_config(file))
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Int(n) => Unexpected::Signed(*n),
        Value::UInt(n) => Unexpected::Unsigned(*n),
        Value::Float(f) => Unexpected::Float(*f),
        Value::Str(s) => Unexpected::Str(s),
        Value::Seq(_) => Unexpected::Seq,
        Value::Map(_) => Unexpected::Map,
    }
}

impl<'de> de::Deserializer<'de> for &'de Node {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match &self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(n) => visitor.visit_i64(*n),
            Value::UInt(n) => visitor.visit_u64(*n),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Seq(items) => visitor.visit_seq(Items(items.iter())),
            Value::Map(entries) => visitor.visit_map(Entries {
                entries: entries.iter(),
                value: None,
            }),
        };
        result.map_err(|e| e.at(self))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.value {
            Value::Str(s) => visitor
                .visit_borrowed_str(s)
                .map_err(|e: DeError| e.at(self)),
            Value::Bool(_) | Value::Int(_) | Value::UInt(_) | Value::Float(_) => {
                Err(DeError::custom(format_args!(
                    "expected a string, found {}; quote the value so YAML keeps it as written",
                    self.value.kind()
                ))
                .at(self))
            }
            other => Err(DeError::custom(format_args!(
                "expected a string, found {}",
                other.kind()
            ))
            .at(self)),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.value {
            Value::Seq(_) => self.deserialize_any(visitor),
            other => Err(
                DeError::custom(format_args!("expected a list, found {}", other.kind())).at(self),
            ),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.value {
            Value::Map(_) => self.deserialize_any(visitor),
            other => {
                Err(<DeError as de::Error>::invalid_type(unexpected(other), &visitor).at(self))
            }
        }
    }

    /// A struct's serde name says what it is (`#[serde(rename = "a route `{ from, to }`")]`),
    /// for the message when the node is not a mapping.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.value {
            Value::Map(_) => self.deserialize_any(visitor),
            other => Err(DeError::custom(format_args!(
                "expected {name} (a mapping), found {}",
                other.kind()
            ))
            .at(self)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.value {
            Value::Str(s) => visitor
                .visit_enum(s.as_str().into_deserializer())
                .map_err(|e: DeError| e.at(self)),
            other => Err(DeError::custom(format_args!(
                "expected a string, found {}",
                other.kind()
            ))
            .at(self)),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct identifier
    }
}

struct Items<'de>(std::slice::Iter<'de, Node>);

impl<'de> de::SeqAccess<'de> for Items<'de> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.0.next() {
            Some(item) => seed.deserialize(item).map(Some).map_err(|e| e.at(item)),
            None => Ok(None),
        }
    }
}

struct Entries<'de> {
    entries: std::slice::Iter<'de, (String, Node)>,
    value: Option<&'de Node>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        // An explicit null (`key:` or `key: ~`) is an absent field.
        for (key, value) in self.entries.by_ref() {
            if value.value == Value::Null {
                continue;
            }
            self.value = Some(value);
            let key: de::value::BorrowedStrDeserializer<'de, DeError> =
                de::value::BorrowedStrDeserializer::new(key);
            // An unknown field is at its key, which is where the entry is located.
            return seed.deserialize(key).map(Some).map_err(|e| e.at(value));
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let value = self
            .value
            .take()
            .ok_or_else(|| DeError::custom("a value was asked for before its key"))?;
        seed.deserialize(value).map_err(|e| e.at(value))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::super::tree::parse;
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename = "a thing")]
    struct Thing {
        name: String,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename = "an item")]
    struct Item {
        id: String,
    }

    fn load(text: &str) -> Result<Thing, String> {
        let root = parse("t.yaml", text).unwrap();
        from_node::<Thing>("t.yaml", &root).map_err(|e| e.to_string())
    }

    #[test]
    fn errors_are_pinned_to_the_innermost_node() {
        assert_eq!(
            load("name: a\nitems:\n  - id: x\n  - id: 5\n").unwrap_err(),
            "t.yaml:4: items[1].id: expected a string, found a number; quote the value so YAML \
             keeps it as written"
        );
        assert_eq!(
            load("name: a\nitems:\n  - id: x\n  - idd: y\n").unwrap_err(),
            "t.yaml:4: items[1].idd: unknown field `idd`; expected one of: id"
        );
        assert_eq!(
            load("name: a\nitems:\n  - id: x\n  -\n    other: 1\n").unwrap_err(),
            "t.yaml:5: items[1].other: unknown field `other`; expected one of: id"
        );
        assert_eq!(
            load("items: []\n").unwrap_err(),
            "t.yaml:1: name: required field is missing"
        );
        assert_eq!(
            load("name: a\nitems:\n  - 3\n").unwrap_err(),
            "t.yaml:3: items[0]: expected an item (a mapping), found a number"
        );
        assert_eq!(
            load("name: a\nitems: x\n").unwrap_err(),
            "t.yaml:2: items: expected a list, found a string"
        );
    }

    #[test]
    fn explicit_null_is_absent() {
        assert_eq!(
            load("name: a\nitems:\n").unwrap(),
            Thing {
                name: "a".into(),
                items: vec![]
            }
        );
        assert_eq!(
            load("name: ~\n").unwrap_err(),
            "t.yaml:1: name: required field is missing"
        );
    }
}
