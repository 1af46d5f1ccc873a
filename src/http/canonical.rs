//! Canonical JSON per RFC 8785, the JSON Canonicalization Scheme (JCS).
//!
//! The Idempotency-Key layer fingerprints a request body so that a retry carrying the same key
//! but a *different* request is caught. A client library that re-serializes the same JSON value
//! on retry may reorder object members or change whitespace, escapes or number spelling; those
//! must not look like a different request. So a JSON body is fingerprinted in its JCS form,
//! which is the same bytes for every spelling of the same JSON value.
//!
//! [`canonicalize`] parses with `serde_json` and writes the value back per RFC 8785 section 3.2:
//!
//! - no whitespace between tokens (3.2.1);
//! - `true`, `false` and `null` as they are, arrays in their order (3.2.2.1);
//! - strings (3.2.2.2): `"` and `\` escaped, U+0000..U+001F as `\b`, `\t`, `\n`, `\f`, `\r`
//!   where those exist and as `\u00xx` (lowercase hex) otherwise, every other character (U+007F
//!   and all non-ASCII too) written as itself in UTF-8;
//! - numbers (3.2.2.3): every number is taken as the IEEE-754 double nearest to its decimal text
//!   and written the way ECMAScript's `Number.prototype.toString` writes that double (shortest
//!   digits that round-trip, the closest of those and the even one on a tie, plain notation for
//!   exponents -7 < e < 21, `1e+21` style outside, both zeros as `0`);
//! - object members sorted by name, names compared as arrays of UTF-16 code units (3.2.3).
//!
//! Input that I-JSON (RFC 7493, which JCS requires) forbids is rejected rather than guessed at:
//! duplicate member names (checked here; `serde_json::Value` would silently keep the last),
//! lone surrogates (`serde_json` rejects them), and numbers that overflow a double, such as
//! `1e400` (`serde_json` rejects them; [`CanonicalError::NumberOutOfRange`]). NaN and
//! infinities cannot be written in JSON at all. Input must be UTF-8 without a byte order mark.
//!
//! Both halves of the number rule come from libraries:
//!
//! - reading: serde_json's `float_roundtrip` feature (turned on by this crate's `http`
//!   feature) makes it parse every number to the nearest double. Without it serde_json may land
//!   an ulp or two off, and two spellings of one number would canonicalize differently.
//!   Integers that fit a `u64` or `i64` reach the visitor as such and are rounded to the nearest
//!   double here (RFC 8785 treats every number as a double: 9007199254740993 is
//!   9007199254740992). Its `arbitrary_precision` feature must stay off: with it, serde_json
//!   hands numbers to a visitor as private maps, and the number tests below fail.
//! - writing: `ryu_js` writes a finite double exactly as ECMAScript's Number::toString does,
//!   `-0` as `0` included.
//!
//! Nesting is limited to [`MAX_DEPTH`] arrays and objects, so a hostile body cannot exhaust the
//! stack: parsing, writing and dropping the parsed tree all recurse once per level.
//! `serde_json` has a limit of its own (it accepts 127 levels and rejects 128); ours is lower so
//! that it always fires first and reports [`CanonicalError::TooDeep`].

use std::cmp::Ordering;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The deepest nesting of arrays and objects accepted: `[[1]]` has depth 2, a scalar depth 0.
pub(crate) const MAX_DEPTH: usize = 100;

/// Why a body could not be put in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CanonicalError {
    /// Not JSON (or not UTF-8, or trailing characters after the value). `line` and `column`
    /// are 1-based as `serde_json` reports them (column 0 for an error at the start of a line).
    InvalidJson {
        /// `serde_json`'s description of the error.
        reason: String,
        /// Line of the error, 1-based.
        line: usize,
        /// Column (byte) of the error within its line.
        column: usize,
    },
    /// An object has two members with this name (after unescaping).
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A number too large in magnitude for an IEEE-754 double.
    NumberOutOfRange {
        /// Line of the number, 1-based.
        line: usize,
        /// Column (byte) of the number's end within its line.
        column: usize,
    },
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl fmt::Display for CanonicalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidJson {
                reason,
                line,
                column,
            } => write!(f, "invalid JSON at line {line} column {column}: {reason}"),
            Self::DuplicateName { name } => {
                write!(f, "duplicate object member name {name:?}")
            }
            Self::NumberOutOfRange { line, column } => write!(
                f,
                "number out of range of an IEEE-754 double at line {line} column {column}"
            ),
            Self::TooDeep => write!(f, "arrays and objects nested deeper than {MAX_DEPTH}"),
        }
    }
}

impl std::error::Error for CanonicalError {}

/// Returns the RFC 8785 canonical form of the JSON text `input`.
///
/// Two texts that are the same JSON value (same members in any order, any whitespace, any
/// escaping of the same characters, any spelling of the same double) give the same bytes, and
/// the output is itself a fixed point: canonicalizing it again returns it unchanged.
pub(crate) fn canonicalize(input: &[u8]) -> Result<Vec<u8>, CanonicalError> {
    let node = parse(input)?;
    let mut out = Vec::with_capacity(input.len());
    write_node(&mut out, &node);
    Ok(out)
}

/// A parsed JSON value, object members already sorted in canonical order.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    /// Always finite.
    Number(f64),
    String(String),
    Array(Vec<Node>),
    /// Sorted by name in UTF-16 code unit order, names unique.
    Object(Vec<(String, Node)>),
}

fn parse(input: &[u8]) -> Result<Node, CanonicalError> {
    let mut failure = None;
    let mut deserializer = serde_json::Deserializer::from_slice(input);
    let parsed = NodeSeed {
        failure: &mut failure,
        depth: 0,
    }
    .deserialize(&mut deserializer)
    .and_then(|node| deserializer.end().map(|()| node));
    parsed.map_err(|error| {
        // A failure the visitor raised itself was recorded with its real kind; serde_json only
        // carried a message for it.
        failure.unwrap_or_else(|| from_serde(&error))
    })
}

fn from_serde(error: &serde_json::Error) -> CanonicalError {
    let (line, column) = (error.line(), error.column());
    let message = error.to_string();
    // serde_json exposes no error code, only this message; a unit test pins it.
    if message.starts_with("number out of range") {
        return CanonicalError::NumberOutOfRange { line, column };
    }
    // Display appends " at line L column C", which the variant carries separately.
    let reason = match message.rfind(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message,
    };
    CanonicalError::InvalidJson {
        reason,
        line,
        column,
    }
}

struct NodeSeed<'s> {
    /// Why parsing stopped, where the visitor stopped it.
    failure: &'s mut Option<CanonicalError>,
    /// Arrays and objects enclosing the value being parsed.
    depth: usize,
}

impl NodeSeed<'_> {
    /// Records why parsing stops, and returns the error that makes serde_json stop.
    fn fail<E: de::Error>(&mut self, failure: CanonicalError) -> E {
        let error = E::custom(&failure);
        *self.failure = Some(failure);
        error
    }

    fn enter<E: de::Error>(&mut self) -> Result<usize, E> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(self.fail(CanonicalError::TooDeep));
        }
        Ok(depth)
    }
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    // RFC 8785 treats every number as a double, integers included: `as` rounds to the nearest
    // one, ties to even, so 9007199254740993 is 9007199254740992.
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        Ok(Node::Number(value as f64))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        Ok(Node::Number(value as f64))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
        // serde_json rejects a number that overflows a double before it gets here; this only
        // keeps `Node::Number` finite should that change. The message makes `from_serde` report
        // it as `NumberOutOfRange`, at the position serde_json attaches.
        if !value.is_finite() {
            return Err(E::custom("number out of range"));
        }
        Ok(Node::Number(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Node, E> {
        Ok(Node::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Node, E> {
        Ok(Node::String(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Node, A::Error> {
        let depth = self.enter()?;
        let mut elements = Vec::new();
        while let Some(element) = seq.next_element_seed(NodeSeed {
            failure: &mut *self.failure,
            depth,
        })? {
            elements.push(element);
        }
        Ok(Node::Array(elements))
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Node, A::Error> {
        let depth = self.enter()?;
        let mut members = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(NodeSeed {
                failure: &mut *self.failure,
                depth,
            })?;
            members.push((name, value));
        }
        members.sort_by(|a, b| cmp_utf16(&a.0, &b.0));
        // Equal names are adjacent once sorted.
        if let Some(pair) = members.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            let name = pair[0].0.clone();
            return Err(self.fail(CanonicalError::DuplicateName { name }));
        }
        Ok(Node::Object(members))
    }
}

/// RFC 8785 3.2.3: names compare as arrays of UTF-16 code units. This differs from comparing
/// UTF-8 bytes (or chars) only when a character above U+FFFF (a surrogate pair, 0xD800..0xDFFF)
/// meets one in U+E000..U+FFFF.
fn cmp_utf16(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

fn write_node(out: &mut Vec<u8>, node: &Node) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        // RFC 8785 3.2.2.3 is ECMAScript's Number::toString, which `ryu_js` implements.
        Node::Number(value) => {
            out.extend_from_slice(ryu_js::Buffer::new().format_finite(*value).as_bytes());
        }
        Node::String(value) => write_string(out, value),
        Node::Array(elements) => {
            out.push(b'[');
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(out, element);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            out.push(b'{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, name);
                out.push(b':');
                write_node(out, value);
            }
            out.push(b'}');
        }
    }
}

/// RFC 8785 3.2.2.2.
fn write_string(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = value.as_bytes();
    // Every byte of a multi-byte UTF-8 sequence is >= 0x80, so escaping byte by byte can only
    // touch ASCII characters; the rest is copied in runs.
    let mut run_start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let short = match byte {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            b'\t' => b't',
            b'\n' => b'n',
            0x0c => b'f',
            b'\r' => b'r',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[run_start..i]);
        run_start = i + 1;
        if short == 0 {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.push(b'\\');
            out.push(short);
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulation::SplitMix64;

    use proptest::prelude::*;
    use serde_json::Value;

    fn canon(input: &str) -> String {
        let out = canonicalize(input.as_bytes())
            .unwrap_or_else(|e| panic!("canonicalize({input:?}) failed: {e}"));
        String::from_utf8(out).expect("canonical JSON is UTF-8")
    }

    /// The canonical text of a double, through `canonicalize` from Rust's shortest spelling.
    fn number(value: f64) -> String {
        canon(&format!("{value:e}"))
    }

    fn error(input: &str) -> CanonicalError {
        match canonicalize(input.as_bytes()) {
            Ok(out) => panic!(
                "{input:?} canonicalized to {:?}",
                String::from_utf8_lossy(&out)
            ),
            Err(e) => e,
        }
    }

    /// The example of RFC 8785 section 3.2.2.
    #[test]
    fn rfc_8785_main_example() {
        let input = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;
        let expected = concat!(
            r#"{"literals":[null,true,false],"#,
            r#""numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"#,
            "\"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}",
        );
        assert_eq!(canon(input), expected);
    }

    /// The sorting example of RFC 8785 section 3.2.3.
    #[test]
    fn rfc_8785_sorting_example() {
        let input = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#;
        let expected = concat!(
            "{\"\\r\":\"Carriage Return\",",
            "\"1\":\"One\",",
            "\"\u{80}\":\"Control\",",
            "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",",
            "\"\u{20ac}\":\"Euro Sign\",",
            "\"\u{1f600}\":\"Emoji: Grinning Face\",",
            "\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
        );
        assert_eq!(canon(input), expected);
    }

    #[test]
    fn names_sort_by_utf16_code_units_not_utf8_bytes() {
        // By UTF-8 bytes (or by char) U+1F600 sorts after U+FB33 and U+FFFF; by UTF-16 code
        // units its lead surrogate 0xD83D sorts before both, though still after U+D7FF.
        assert_eq!(cmp_utf16("\u{1f600}", "\u{fb33}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{1f600}", "\u{ffff}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{1f600}", "\u{e000}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{1f600}", "\u{d7ff}"), Ordering::Greater);
        assert_eq!(cmp_utf16("\u{e9}", "\u{1f600}"), Ordering::Less);
        assert_eq!(cmp_utf16("a", "ab"), Ordering::Less);
        assert_eq!(cmp_utf16("", "a"), Ordering::Less);
        assert_eq!(
            canon("{\"\u{ffff}\":1,\"\u{1f600}\":2,\"\u{e9}\":3,\"\u{d7ff}\":4}"),
            "{\"\u{e9}\":3,\"\u{d7ff}\":4,\"\u{1f600}\":2,\"\u{ffff}\":1}"
        );
    }

    #[test]
    fn number_serialization() {
        let cases = [
            ("1e2", "100"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("0", "0"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("1e-7", "1e-7"),
            ("0.000001", "0.000001"),
            ("0.0000012345", "0.0000012345"),
            ("123456789012345680000", "123456789012345680000"),
            ("123456789012345678901", "123456789012345680000"),
            ("4.5", "4.5"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("333333333.33333329", "333333333.3333333"),
            ("1E30", "1e+30"),
            ("1e-27", "1e-27"),
            ("0.000000000000000000000000001", "1e-27"),
            ("9007199254740992", "9007199254740992"),
            ("9007199254740993", "9007199254740992"),
            ("9007199254740995", "9007199254740996"),
            ("-9007199254740993", "-9007199254740992"),
            ("18446744073709551615", "18446744073709552000"),
            ("-9223372036854775808", "-9223372036854776000"),
            ("-1.5e+300", "-1.5e+300"),
            ("5e-324", "5e-324"),
            ("2e-324", "0"),
            ("3e-324", "5e-324"),
            ("1e-400", "0"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("-1.7976931348623157e308", "-1.7976931348623157e+308"),
            ("1.5", "1.5"),
            ("-1.5", "-1.5"),
            ("12.34e1", "123.4"),
            ("0.1", "0.1"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("100.0", "100"),
            ("1.0e0", "1"),
            ("123e-2", "1.23"),
            ("1e-6", "0.000001"),
            ("1.5e-7", "1.5e-7"),
            ("12345678901234567890e-30", "1.2345678901234568e-11"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "input {input}");
            assert_eq!(canon(&format!("[{input}]")), format!("[{expected}]"));
        }
    }

    /// RFC 8785 Appendix B: doubles given by their bits and their canonical text.
    #[test]
    fn rfc_8785_appendix_b_numbers() {
        let cases: [(u64, &str); 25] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
            (0x3ff0000000000000, "1"),
        ];
        for (bits, expected) in cases {
            let value = f64::from_bits(bits);
            assert_eq!(number(value), expected, "bits {bits:016x}");
            // And the text reads back as the same double (zero's sign aside).
            assert_eq!(canon(expected), expected);
            assert_eq!(expected.parse::<f64>().unwrap(), value, "bits {bits:016x}");
        }
    }

    #[test]
    fn doubles_with_short_exact_expansions() {
        // The doubles whose exact value has few enough digits for two shortest candidates to be
        // equally close, and some that have too many; the expectations are what node's
        // `String(x)` writes.
        for (text, expected) in [
            ("0.5", "0.5"),
            ("0.125", "0.125"),
            ("1424953923781206.25", "1424953923781206.2"),
            ("81079.433837890625", "81079.43383789062"),
            ("3", "3"),
            ("1e17", "100000000000000000"),
            ("1e22", "1e+22"),
            ("576460752303423488", "576460752303423500"), // 2^59
            ("864691128455135232", "864691128455135200"), // 3 × 2^58
            ("3458764513820540928", "3458764513820541000"), // 3 × 2^60: 19 digits
            ("1e23", "1e+23"),                            // 99999999999999991611392
            ("0.1", "0.1"),
            ("1e-7", "1e-7"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
        ] {
            assert_eq!(canon(text), expected, "{text}");
        }
    }

    #[test]
    fn number_edges() {
        // Both zeros are "0".
        assert_eq!(number(-0.0), "0");
        assert_eq!(canon("[-0, 0, -0.0, 0e-5, -0E+7]"), "[0,0,0,0,0]");
        // The smallest subnormal, the largest double, and what rounds to or past them.
        assert_eq!(number(f64::from_bits(1)), "5e-324");
        assert_eq!(number(-f64::from_bits(1)), "-5e-324");
        assert_eq!(canon("4.9406564584124654e-324"), "5e-324");
        assert_eq!(canon("2.4703282292062327e-324"), "0"); // under half of it
        assert_eq!(canon("2.4703282292062328e-324"), "5e-324"); // over half of it
        assert_eq!(number(f64::MAX), "1.7976931348623157e+308");
        assert_eq!(number(f64::MIN), "-1.7976931348623157e+308");
        assert_eq!(number(f64::MIN_POSITIVE), "2.2250738585072014e-308");
        assert_eq!(canon("2.2250738585072011e-308"), "2.225073858507201e-308");
        assert_eq!(canon("2.2250738585072012e-308"), "2.2250738585072014e-308");
        // Where plain notation gives way to exponents, both ends.
        assert_eq!(canon("1e21"), "1e+21");
        assert_eq!(canon("999999999999999999999"), "1e+21");
        assert_eq!(canon("1e20"), "100000000000000000000");
        assert_eq!(canon("1e-7"), "1e-7");
        assert_eq!(canon("0.0000001"), "1e-7");
        assert_eq!(canon("-0.0000001234"), "-1.234e-7");
        assert_eq!(canon("123456789e-15"), "1.23456789e-7");
        assert_eq!(canon("1e-6"), "0.000001");
        // 0.1 + 0.2 in its own shortest spelling, which is also what node writes.
        assert_eq!(number(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(canon("0.30000000000000004"), "0.30000000000000004");
        assert_ne!(canon("0.30000000000000004"), canon("0.3"));
        // Integers beyond 2^53 round to the nearest double, ties to even, whether serde_json
        // reads them as integers (up to u64/i64) or as floats (beyond).
        assert_eq!(canon("9007199254740993"), "9007199254740992");
        assert_eq!(canon("9007199254740993.0000000001"), "9007199254740994");
        assert_eq!(canon("9007199254740994"), "9007199254740994");
        assert_eq!(canon("9007199254740995"), "9007199254740996");
        assert_eq!(canon("18446744073709551615"), "18446744073709552000"); // u64::MAX
        assert_eq!(canon("18446744073709551616"), "18446744073709552000"); // 2^64
        assert_eq!(canon("-9223372036854775808"), "-9223372036854776000"); // i64::MIN
        assert_eq!(canon("-9223372036854775809"), "-9223372036854776000");
        // A decimal exactly halfway between two doubles takes the even one; a hair above, not.
        assert_eq!(
            canon("1.00000000000000011102230246251565404236316680908203125"),
            "1"
        );
        assert_eq!(
            canon("1.00000000000000011102230246251565404236316680908203126"),
            "1.0000000000000002"
        );
    }

    #[test]
    fn equally_close_shortest_digits_take_the_even_one() {
        // Each double lies exactly halfway between two shortest candidates (exact values
        // 81079.433837890625, 635425613737198.25, 1054609648378925.25); Rust's `{:e}` takes the
        // odd one. The expectations are what node's `String(x)` writes.
        assert_eq!(canon("81079.433837890625"), "81079.43383789062");
        assert_eq!(canon("8.107943383789063e4"), "81079.43383789062");
        assert_eq!(canon("635425613737198.25"), "635425613737198.2");
        assert_eq!(canon("1054609648378925.25"), "1054609648378925.2");
        assert_eq!(canon("-1054609648378925.3"), "-1054609648378925.2");
        assert_eq!(canon("123e-20"), "1.23e-18");
    }

    #[test]
    fn numbers_take_the_nearest_double_not_serde_json_s_approximation() {
        // serde_json without its `float_roundtrip` feature returns 1.0715660391465825e-75 for
        // this text; the nearest double is the one the text was printed from.
        assert_eq!(canon("1.0715660391465826e-75"), "1.0715660391465826e-75");
        assert_eq!(canon("-1.81996730402717e-179"), "-1.81996730402717e-179");
        assert_eq!(canon("-1.603964615428183e143"), "-1.603964615428183e+143");
        // Different spellings of one double are one canonical number.
        assert_eq!(
            canon("[0.1, 1e-1, 0.10000000000000000555, 100e-3, 0.1000000000000000055511151231257827021181583404541015625]"),
            "[0.1,0.1,0.1,0.1,0.1]"
        );
    }

    #[test]
    fn string_escapes() {
        assert_eq!(canon(r#""\"\\\/""#), r#""\"\\/""#);
        assert_eq!(
            canon(r#""\u0000\u0001\u0007\b\t\n\u000b\f\r\u000e\u001f\u0020""#),
            r#""\u0000\u0001\u0007\b\t\n\u000b\f\r\u000e\u001f ""#
        );
        // U+007F, U+0080 and everything above are written as themselves, however escaped.
        assert_eq!(
            canon(r#""\u007f\u0080\u00e9\u20AC\uD83D\uDE00\uFFFF""#),
            "\"\u{7f}\u{80}\u{e9}\u{20ac}\u{1f600}\u{ffff}\""
        );
        assert_eq!(
            canon("\"\u{7f}\u{e9}\u{1f600}\""),
            "\"\u{7f}\u{e9}\u{1f600}\""
        );
        assert_eq!(canon(r#""\u0041\u00e9""#), "\"A\u{e9}\"");
        // Names are escaped the same way.
        assert_eq!(
            canon(r#"{"\t\u001F\"":"\u0008"}"#),
            r#"{"\t\u001f\"":"\b"}"#
        );
        let mut out = Vec::new();
        write_string(&mut out, "a\u{1}b\u{1f}c\"d\\e\u{7f}");
        assert_eq!(out, b"\"a\\u0001b\\u001fc\\\"d\\\\e\x7f\"");
    }

    #[test]
    fn lone_surrogates_are_rejected() {
        for input in [
            r#""\ud800""#,
            r#""\ud800x""#,
            r#""\udc00""#,
            r#""\ude00\ud83d""#,
            r#"{"\ud83d":1}"#,
        ] {
            assert!(
                matches!(error(input), CanonicalError::InvalidJson { .. }),
                "{input}"
            );
        }
    }

    #[test]
    fn literals_arrays_and_nesting() {
        assert_eq!(canon(" true "), "true");
        assert_eq!(canon("false"), "false");
        assert_eq!(canon("null"), "null");
        assert_eq!(canon("\"\""), "\"\"");
        assert_eq!(canon("[]"), "[]");
        assert_eq!(canon("{}"), "{}");
        assert_eq!(canon("[ [ ] , { } ]"), "[[],{}]");
        assert_eq!(
            canon(r#"[3, 1, 2, {"z": [{"b": null, "a": [true, false]}], "y": {}}, "x"]"#),
            r#"[3,1,2,{"y":{},"z":[{"a":[true,false],"b":null}]},"x"]"#
        );
        assert_eq!(
            canon("\t{\r\n\"b\"\n:\t1 ,\"a\": {\"d\":4,\"c\":[3.0,\"3\"]}}\n"),
            r#"{"a":{"c":[3,"3"],"d":4},"b":1}"#
        );
    }

    #[test]
    fn reordering_and_whitespace_do_not_change_the_canonical_form() {
        let a = canon(r#"{"b":1, "a":[1, 2]}"#);
        let b = canon(r#"{ "a" : [1,2], "b" : 1 }"#);
        assert_eq!(a, b);
        assert_eq!(a, r#"{"a":[1,2],"b":1}"#);
        // Array order is significant.
        assert_ne!(canon("[1,2]"), canon("[2,1]"));
    }

    #[test]
    fn duplicate_names_are_rejected() {
        for (input, name) in [
            (r#"{"a":1,"a":2}"#, "a"),
            (r#"{"a":1,"b":2,"a":1}"#, "a"),
            (r#"{"a":1,"\u0061":2}"#, "a"),
            (r#"[{"x":{"k":1,"k":1}}]"#, "k"),
            (r#"{"\ud83d\ude00":1,"😀":2}"#, "😀"),
        ] {
            assert_eq!(
                error(input),
                CanonicalError::DuplicateName {
                    name: name.to_owned()
                },
                "{input}"
            );
        }
        // Names differing only in case, or as escaped text, are distinct.
        assert_eq!(canon(r#"{"a":1,"A":2}"#), r#"{"A":2,"a":1}"#);
        assert_eq!(canon(r#"{"\\u0061":1,"a":2}"#), r#"{"\\u0061":1,"a":2}"#);
    }

    #[test]
    fn invalid_json_is_rejected() {
        for input in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{'a':1}",
            "{\"a\" 1}",
            "[1 2]",
            "1 2",
            "01",
            "1.",
            ".5",
            "+1",
            "0x10",
            "NaN",
            "Infinity",
            "-Infinity",
            "[1e]",
            "nul",
            "True",
            "\"a",
            "\"\\x\"",
            "\"tab\there\"",
            "\u{feff}{}",
            "/* comment */ 1",
            "{} x",
        ] {
            assert!(
                matches!(error(input), CanonicalError::InvalidJson { .. }),
                "{input:?}"
            );
        }
        // Not UTF-8.
        for input in [
            &b"\"\xff\""[..],
            b"\"\xc3\"",
            b"\"\xed\xa0\x80\"",
            b"[\xe9]",
        ] {
            assert!(matches!(
                canonicalize(input),
                Err(CanonicalError::InvalidJson { .. })
            ));
        }
        assert_eq!(
            error("[1,\n  nope]"),
            CanonicalError::InvalidJson {
                reason: "expected ident".to_owned(),
                line: 2,
                column: 4,
            }
        );
    }

    #[test]
    fn numbers_near_the_largest_double() {
        // Just under the halfway point between the largest double and 2^1024, so it is the
        // largest double (serde_json without its `float_roundtrip` feature overflows on it).
        assert_eq!(
            canon("[1.7976931348623158e308]"),
            "[1.7976931348623157e+308]"
        );
        // 2^1024 - 2^970, exactly halfway: ties go to the even neighbour, 2^1024, out of range.
        let halfway = "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792";
        assert!(matches!(
            error(halfway),
            CanonicalError::NumberOutOfRange { .. }
        ));
        let below = format!("-{}.{}e308", &halfway[..1], &halfway[1..halfway.len() - 1]);
        assert_eq!(canon(&below), "-1.7976931348623157e+308");
        // Just over: 2^1024 when rounded, which is out of range.
        assert!(matches!(
            error("1.797693134862315808e308"),
            CanonicalError::NumberOutOfRange { .. }
        ));
    }

    #[test]
    fn numbers_out_of_range_are_rejected_at_their_end() {
        assert_eq!(
            error("[\n 1e400]"),
            CanonicalError::NumberOutOfRange { line: 2, column: 6 }
        );
        // Long integers and decimals take serde_json's other parsing path.
        assert_eq!(
            error(&format!("[\n 1{}]", "0".repeat(400))),
            CanonicalError::NumberOutOfRange {
                line: 2,
                column: 402
            }
        );
        assert_eq!(
            error(&format!("[\n -1.{}e400]", "0".repeat(30))),
            CanonicalError::NumberOutOfRange {
                line: 2,
                column: 38
            }
        );
        // Should serde_json ever hand the visitor an infinity, it is refused the same way.
        let mut failure = None;
        let refused = NodeSeed {
            failure: &mut failure,
            depth: 0,
        }
        .visit_f64::<serde_json::Error>(f64::INFINITY)
        .unwrap_err();
        assert!(matches!(
            from_serde(&refused),
            CanonicalError::NumberOutOfRange { .. }
        ));
    }

    #[test]
    fn numbers_beyond_a_double_are_rejected() {
        for input in [
            "1e400",
            "-1e400",
            "[0, 1.8e308]",
            "{\"a\": -1.7976931348623159e308}",
            &format!("1{}", "0".repeat(400)),
        ] {
            assert!(
                matches!(error(input), CanonicalError::NumberOutOfRange { .. }),
                "{input}"
            );
        }
        assert_eq!(
            error("[1,\n 1e400]"),
            CanonicalError::NumberOutOfRange { line: 2, column: 6 }
        );
    }

    #[test]
    fn nesting_is_limited() {
        let nested = |depth: usize, open: &str, close: &str| {
            format!("{}1{}", open.repeat(depth), close.repeat(depth))
        };
        assert!(canonicalize(nested(MAX_DEPTH, "[", "]").as_bytes()).is_ok());
        assert!(canonicalize(nested(MAX_DEPTH, "{\"a\":", "}").as_bytes()).is_ok());
        for depth in [MAX_DEPTH + 1, 127, 128, 100_000] {
            assert_eq!(error(&nested(depth, "[", "]")), CanonicalError::TooDeep);
            assert_eq!(
                error(&nested(depth, "{\"a\":", "}")),
                CanonicalError::TooDeep
            );
        }
        // Mixed, and only the depth counts, not the total number of containers.
        let mixed = "[{\"a\":".repeat(MAX_DEPTH / 2) + "1" + &"}]".repeat(MAX_DEPTH / 2);
        assert!(canonicalize(mixed.as_bytes()).is_ok());
        let wide = format!("[{}]", vec!["[[]]"; 10_000].join(","));
        assert!(canonicalize(wide.as_bytes()).is_ok());
        // Unclosed: the limit fires before the end of input is noticed.
        assert_eq!(error(&"[".repeat(MAX_DEPTH + 1)), CanonicalError::TooDeep);
    }

    #[test]
    fn errors_display_their_reason() {
        assert_eq!(
            error("{\"a\":1,\"a\":2}").to_string(),
            "duplicate object member name \"a\""
        );
        assert_eq!(
            error("[1e400]").to_string(),
            "number out of range of an IEEE-754 double at line 1 column 6"
        );
        assert_eq!(
            error("[1,]").to_string(),
            "invalid JSON at line 1 column 4: trailing comma"
        );
        assert_eq!(
            CanonicalError::TooDeep.to_string(),
            format!("arrays and objects nested deeper than {MAX_DEPTH}")
        );
        let boxed: Box<dyn std::error::Error> = Box::new(CanonicalError::TooDeep);
        assert!(boxed.source().is_none());
    }

    /// The golden file of the number test: after `#` comment lines, one `text<TAB>answer` a
    /// line, the answer being what Node.js's `String(Number(text))` printed for `text`.
    /// Read when the test runs, not included at build time: the helper that regenerates it
    /// must build without it.
    const NODE_NUMBERS_PATH: &str = "src/http/testdata/numbers-node.txt";
    /// Rewrites the golden file from `number_spellings` (needs node).
    const REGENERATE_NODE_NUMBERS: &str = "scripts/regenerate-node-numbers";

    /// The inputs of the golden file: many doubles, each in several spellings, from a fixed
    /// seed. A change here needs the file regenerated (`REGENERATE_NODE_NUMBERS`).
    fn number_spellings() -> Vec<String> {
        let mut rng = Scrambler::new(0x9e37_79b9_7f4a_7c15);
        let mut texts = Vec::new();
        for i in 0..30_000 {
            let value = match i % 3 {
                0 => f64::from_bits(rng.next()),
                // Short binary fractions and integers: the doubles that can tie.
                1 => {
                    let mantissa = rng.next() >> 11;
                    let exponent = i32::try_from(rng.below(120)).unwrap() - 40;
                    mantissa as f64 * 2f64.powi(exponent)
                }
                // Integers around 2^53 and beyond, written as integers.
                _ => {
                    let bits = rng.below(64);
                    texts.push(format!("{}", rng.next() >> bits));
                    texts.push(format!("-{}", rng.next() >> bits));
                    continue;
                }
            };
            if value.is_finite() {
                texts.push(format!("{value:e}"));
                texts.push(format!("{value:.20e}"));
            }
        }
        texts.extend(
            [
                "-0",
                "0",
                "5e-324",
                "1e21",
                "1e-7",
                "1.7976931348623157e308",
            ]
            .map(String::from),
        );
        texts
    }

    /// `canonicalize(text)` is Node.js's `String(Number(text))` for every spelling in the golden
    /// file, and the file holds exactly the spellings `number_spellings` makes, in order, so
    /// that a changed generator cannot go unchecked against a stale file.
    #[test]
    fn numbers_match_nodes_answers_in_the_golden_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(NODE_NUMBERS_PATH);
        let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "reading {}: {e} ({REGENERATE_NODE_NUMBERS} writes it)",
                path.display()
            )
        });
        let mut cases = Vec::new();
        for (i, line) in golden.lines().enumerate() {
            if line.starts_with('#') {
                continue;
            }
            let (text, answer) = line.split_once('\t').unwrap_or_else(|| {
                panic!("{NODE_NUMBERS_PATH} line {}: no tab in {line:?}", i + 1)
            });
            cases.push((i + 1, text, answer));
        }

        let spellings = number_spellings();
        let stale = format!(
            "{NODE_NUMBERS_PATH} does not hold the spellings number_spellings() makes: run \
             {REGENERATE_NODE_NUMBERS} (needs node) and commit the file"
        );
        for ((line, text, _), spelling) in cases.iter().zip(&spellings) {
            assert_eq!(text, spelling, "{stale} (first difference: line {line})");
        }
        assert_eq!(cases.len(), spellings.len(), "{stale} (a different count)");

        for (line, text, answer) in cases {
            assert_eq!(
                canon(text),
                answer,
                "input {text} ({NODE_NUMBERS_PATH} line {line})"
            );
        }
    }

    /// Not a check: a helper of `REGENERATE_NODE_NUMBERS`, which runs it to learn the
    /// spellings. With `IDEMDB_WRITE_SPELLINGS=path`, writes `number_spellings` to that path,
    /// one a line; without it, writes nothing and passes, so `cargo test -- --ignored` passes.
    #[test]
    #[ignore = "a helper of scripts/regenerate-node-numbers"]
    fn write_number_spellings() {
        let Some(path) = std::env::var_os("IDEMDB_WRITE_SPELLINGS") else {
            return;
        };
        let text: String = number_spellings()
            .iter()
            .map(|spelling| format!("{spelling}\n"))
            .collect();
        let path = std::path::Path::new(&path);
        std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    // --- Property tests -------------------------------------------------------------------

    fn arb_name() -> impl Strategy<Value = String> {
        // Arbitrary names, and names built from characters whose UTF-16 and UTF-8 orders
        // disagree, so that sorting is exercised where it matters.
        prop_oneof![
            any::<String>(),
            proptest::collection::vec(
                proptest::sample::select(vec![
                    'a',
                    'B',
                    '\u{e9}',
                    '\u{fb33}',
                    '\u{ffff}',
                    '\u{1f600}',
                    '\u{10ffff}',
                    '\u{7f}',
                    '\n'
                ]),
                0..4
            )
            .prop_map(|chars| chars.into_iter().collect()),
        ]
    }

    fn arb_number() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1000i32..1000).prop_map(|x| Value::from(f64::from(x) / 8.0)),
        ]
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            arb_number(),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(8, 96, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                proptest::collection::vec((arb_name(), inner), 0..8)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn as_f64(value: &Value) -> f64 {
        value.as_f64().expect("serde_json numbers convert to f64")
    }

    /// `parsed` (from canonical output) is `original` exactly, numbers as doubles.
    fn same_as_node(node: &Node, original: &Value) -> bool {
        match (node, original) {
            (Node::Null, Value::Null) => true,
            (Node::Bool(a), Value::Bool(b)) => a == b,
            // -0 == 0: JCS writes both as "0".
            (Node::Number(a), Value::Number(_)) => *a == as_f64(original),
            (Node::String(a), Value::String(b)) => a == b,
            (Node::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_as_node(a, b))
            }
            (Node::Object(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(name, a)| b.get(name).is_some_and(|b| same_as_node(a, b)))
                    && a.windows(2)
                        .all(|w| cmp_utf16(&w[0].0, &w[1].0) == Ordering::Less)
            }
            _ => false,
        }
    }

    /// `reparsed` is `original`, numbers compared as doubles (-0 == 0: JCS writes both as "0").
    fn same_value(reparsed: &Value, original: &Value) -> bool {
        match (reparsed, original) {
            (Value::Number(_), Value::Number(_)) => as_f64(reparsed) == as_f64(original),
            (Value::Array(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_value(a, b))
            }
            (Value::Object(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(name, a)| b.get(name).is_some_and(|b| same_value(a, b)))
            }
            _ => reparsed == original,
        }
    }

    /// Writes `value` as valid JSON that is not canonical: members in a shuffled order, random
    /// whitespace, characters escaped at random, numbers in other spellings of the same double.
    struct Scrambler {
        rng: SplitMix64,
        out: String,
    }

    impl Scrambler {
        fn new(seed: u64) -> Scrambler {
            Scrambler {
                rng: SplitMix64::new(seed),
                out: String::new(),
            }
        }

        fn next(&mut self) -> u64 {
            self.rng.next_u64()
        }

        fn below(&mut self, n: usize) -> usize {
            self.rng.index(n)
        }

        fn space(&mut self) {
            for _ in 0..self.below(4).saturating_sub(1) {
                let ws = [' ', '\t', '\n', '\r'];
                let i = self.below(4);
                self.out.push(ws[i]);
            }
        }

        fn string(&mut self, s: &str) {
            use std::fmt::Write;
            self.out.push('"');
            for c in s.chars() {
                match (c, self.below(3)) {
                    ('"', _) => self.out.push_str("\\\""),
                    ('\\', _) => self.out.push_str("\\\\"),
                    ('/', 0) => self.out.push_str("\\/"),
                    ('\n', 0) => self.out.push_str("\\n"),
                    (c, 1) | (c @ '\0'..='\x1f', _) => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            if self.below(2) == 0 {
                                write!(self.out, "\\u{unit:04x}").unwrap();
                            } else {
                                write!(self.out, "\\u{unit:04X}").unwrap();
                            }
                        }
                    }
                    (c, _) => self.out.push(c),
                }
            }
            self.out.push('"');
        }

        fn number(&mut self, value: &Value) {
            use std::fmt::Write;
            let x = as_f64(value);
            if value.is_f64() || self.below(2) == 0 {
                match self.below(5) {
                    // Exact decimal expansion: hundreds of digits for extreme exponents.
                    0 => write!(self.out, "{x}").unwrap(),
                    1 => write!(self.out, "{x:e}").unwrap(),
                    2 => write!(self.out, "{x:E}").unwrap(),
                    // 17 significant digits always identify a double.
                    3 => write!(self.out, "{x:.16e}").unwrap(),
                    _ => write!(self.out, "{x:.30e}").unwrap(),
                }
            } else {
                // An integer's own digits denote the nearest double, like the value does.
                write!(self.out, "{value}").unwrap();
            }
        }

        fn value(&mut self, value: &Value) {
            self.space();
            match value {
                Value::Number(_) => self.number(value),
                Value::String(s) => self.string(s),
                Value::Array(elements) => {
                    self.out.push('[');
                    for (i, element) in elements.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.value(element);
                    }
                    self.space();
                    self.out.push(']');
                }
                Value::Object(members) => {
                    let mut members: Vec<_> = members.iter().collect();
                    // Fisher-Yates.
                    for i in (1..members.len()).rev() {
                        let j = self.below(i + 1);
                        members.swap(i, j);
                    }
                    self.out.push('{');
                    for (i, (name, value)) in members.into_iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.space();
                        self.string(name);
                        self.space();
                        self.out.push(':');
                        self.value(value);
                    }
                    self.space();
                    self.out.push('}');
                }
                other => self.out.push_str(&other.to_string()),
            }
            self.space();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn canonical_form_is_a_fixed_point_and_keeps_the_value(value in arb_value()) {
            let text = serde_json::to_vec(&value).unwrap();
            let canonical = canonicalize(&text).unwrap();
            prop_assert_eq!(&canonicalize(&canonical).unwrap(), &canonical);
            let node = parse(&canonical).unwrap();
            prop_assert!(same_as_node(&node, &value), "{}", String::from_utf8_lossy(&canonical));
            let reparsed: Value = serde_json::from_slice(&canonical).unwrap();
            prop_assert!(same_value(&reparsed, &value), "{}", String::from_utf8_lossy(&canonical));
            // No insignificant whitespace survives: outside strings there is none at all.
            let pretty = serde_json::to_vec_pretty(&value).unwrap();
            prop_assert_eq!(canonicalize(&pretty).unwrap(), canonical);
        }

        #[test]
        fn every_spelling_of_a_value_has_one_canonical_form(value in arb_value(), seed in any::<u64>()) {
            let canonical = canonicalize(&serde_json::to_vec(&value).unwrap()).unwrap();
            let mut scrambler = Scrambler::new(seed);
            scrambler.value(&value);
            let scrambled = canonicalize(scrambler.out.as_bytes());
            prop_assert_eq!(scrambled, Ok(canonical), "{}", scrambler.out);
        }
    }

    /// The significant digits (no leading or trailing zeros) and exponent e of a decimal text
    /// of a non-zero number, value = ±0.digits × 10^e, for comparing spellings of one decimal.
    fn digits_and_exponent(text: &str) -> (String, i32) {
        let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
        let exponent: i32 = exponent.parse().unwrap();
        let mantissa = mantissa.trim_start_matches('-');
        let point = mantissa.find('.').unwrap_or(mantissa.len());
        let all: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let leading = all.len() - all.trim_start_matches('0').len();
        let digits = all.trim_matches('0').to_owned();
        let point = i32::try_from(point).unwrap() - i32::try_from(leading).unwrap();
        (digits, exponent + point)
    }

    proptest! {
        // Cheap cases; ties are rare even among the biased doubles (about 1 in 250 of those).
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// Checks ryu_js's choice of digits against the standard library's: Rust's `{:e}`
        /// writes the fewest digits that read back, the closest such, but where two are equally
        /// close it may take the odd one; Rust's fixed precision output is the exact value
        /// rounded half to even, so at the same digit count it is ECMAScript's choice whenever
        /// it reads back as the same double.
        #[test]
        fn shortest_digits_are_the_closest_and_the_even_one_on_a_tie(value in prop_oneof![
            any::<u64>().prop_map(f64::from_bits),
            // Short binary fractions and integers: the only doubles that can tie.
            (1u64..1 << 53, -40i32..80).prop_map(|(m, e)| m as f64 * 2f64.powi(e)),
        ]) {
            prop_assume!(value.is_finite() && value != 0.0);
            let shortest = format!("{value:e}");
            let (digits, _) = digits_and_exponent(&shortest);
            let nearest = format!("{value:.*e}", digits.len() - 1);
            let expected = if nearest.parse() == Ok(value) { nearest } else { shortest };
            let canonical = number(value);
            prop_assert_eq!(
                digits_and_exponent(&canonical),
                digits_and_exponent(&expected),
                "{} (expected {})", canonical, expected
            );
        }

        #[test]
        fn numbers_read_back_as_the_same_double(x in any::<f64>().prop_filter("finite", |x| x.is_finite())) {
            let text = number(x);
            prop_assert_eq!(text.parse::<f64>().unwrap(), x);
            prop_assert_eq!(canon(&text), text.clone());
            // Other spellings: every digit of the exact value, and 26 significant digits.
            prop_assert_eq!(canon(&format!("{x}")), text.clone());
            prop_assert_eq!(canon(&format!("{x:.25e}")), text);
        }
    }
}
