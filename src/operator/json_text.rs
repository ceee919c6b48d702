//! Parts of cached objects kept as JSON text rather than as parsed trees.
//!
//! The watch caches hold every managed object for the life of the
//! process, and a decision reads most of an object once, when it is
//! gathered. Parsed, the same bytes cost several times as much: an
//! OpenMedModel's status (conditions, the last two good specs, a canary's
//! progress) is about 2.3 KB as text and 11 KB as a tree of `Value`s,
//! where every map entry is a hashed key, a boxed string and an 80-byte
//! value; a typed Deployment of 2 KB of JSON takes 10 KB, most of it the
//! empty optional fields of its pod template held inline. So the parts a
//! decision reads whole are kept as text and parsed when gathered, and
//! only what every lookup needs (the metadata) stays parsed.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A JSON value kept as its compact text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonText(Box<str>);

impl JsonText {
    /// The compact text of `value`.
    pub fn of(value: &Value) -> Self {
        JsonText(value.to_string().into_boxed_str())
    }

    /// The value again.
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.0).expect("the text of a JSON value parses")
    }

    /// The text of a typed part of an object (a write's answer).
    pub fn of_part<T: Serialize>(part: Option<&T>) -> Option<Self> {
        part.map(|p| JsonText::of(&serde_json::to_value(p).expect("a typed part serializes")))
    }

    /// The typed part again. Text the type cannot read (a field of a newer
    /// API it does not know is dropped, not refused) reads as absent, as a
    /// decision would treat an object without it.
    pub fn part<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(&self.0).ok()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|v| JsonText::of(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_reads_back_as_the_value_it_was_made_of_keys_in_order() {
        let value = json!({"z": 1, "a": [true, null, "x"], "m": {"b": 2.5, "a": {}}});
        let text = JsonText::of(&value);
        assert_eq!(text.value(), value);
        assert_eq!(serde_json::to_string(&text).unwrap(), value.to_string());
        let back: JsonText = serde_json::from_str(&value.to_string()).unwrap();
        assert_eq!(back, text);
    }
}
