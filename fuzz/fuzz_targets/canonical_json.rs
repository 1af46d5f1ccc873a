//! RFC 8785 canonicalisation of request bodies, from the network. Two modes:
//!
//! - **Raw bytes.** No panic and no stack overflow, whatever the bytes (deep nesting included:
//!   the seed corpus has a body nested 100,000 levels). A body that canonicalises gives a fixed
//!   point (canonicalising the output again returns it unchanged), and the same bytes as the
//!   value `serde_json` reads from the body, written back by `serde_json` (other member order,
//!   other number and string spellings).
//! - **One value, two spellings.** A JSON value built from the input is written twice, each time
//!   with its own member order, whitespace, string escapes and number spellings: the two texts
//!   canonicalise to the same bytes, or both are refused (a repeated member name, nesting past
//!   the limit).

#![no_main]

use arbitrary::Arbitrary;
use idemdb::http::fuzzing::canonicalize;
use idemdb::simulation::SplitMix64;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Spelled { value: Value, a: u64, b: u64 },
}

#[derive(Arbitrary, Debug)]
enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

fn space(out: &mut String, c: &mut SplitMix64) {
    for _ in 0..c.below(3) {
        out.push([' ', '\t', '\n', '\r'][c.below(4) as usize]);
    }
}

fn string(out: &mut String, s: &str, c: &mut SplitMix64) {
    out.push('"');
    for ch in s.chars() {
        let short = match ch {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\t' => Some("\\t"),
            '\r' => Some("\\r"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '/' => Some("\\/"),
            _ => None,
        };
        let must_escape = ch < ' ' || ch == '"' || ch == '\\';
        let pick = c.below(4);
        match short {
            Some(short) if pick < 2 => out.push_str(short),
            _ if must_escape || pick == 2 => {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            _ => out.push(ch),
        }
    }
    out.push('"');
}

fn number(out: &mut String, value: &Value, c: &mut SplitMix64) {
    match *value {
        Value::Int(i) => match c.below(4) {
            0 => out.push_str(&i.to_string()),
            1 => out.push_str(&format!("{i}.0")),
            2 => out.push_str(&format!("{i}e0")),
            _ if i == 0 => out.push_str("0E-1"),
            _ => out.push_str(&format!("{i}0E-1")), // ten times the value, over ten
        },
        Value::Float(f) if f.is_finite() => match c.below(3) {
            0 => out.push_str(&format!("{f}")),
            1 => out.push_str(&format!("{f:e}")),
            _ => out.push_str(&format!("{f:E}")),
        },
        _ => out.push_str("null"), // not a finite double: JSON has no spelling for it
    }
}

fn write(out: &mut String, value: &Value, c: &mut SplitMix64) {
    space(out, c);
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(_) | Value::Float(_) => number(out, value, c),
        Value::Str(s) => string(out, s, c),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, item, c);
            }
            space(out, c);
            out.push(']');
        }
        Value::Object(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, c.below(i as u64 + 1) as usize);
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                space(out, c);
                string(out, &members[i].0, c);
                space(out, c);
                out.push(':');
                write(out, &members[i].1, c);
            }
            space(out, c);
            out.push('}');
        }
    }
    space(out, c);
}

fn spelled(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    write(&mut out, value, &mut SplitMix64::new(seed));
    out
}

fuzz_target!(|input: Input| match input {
    Input::Raw(body) => {
        let Ok(canonical) = canonicalize(&body) else {
            return;
        };
        assert_eq!(
            canonicalize(&canonical).as_ref(),
            Ok(&canonical),
            "the canonical form is not a fixed point"
        );
        // serde_json keeps the last of repeated names and nests deeper; where canonicalize
        // accepted the body neither applies, and serde_json reads the same value.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&body) {
            let rewritten = serde_json::to_vec(&value).expect("a value serde_json read");
            assert_eq!(
                canonicalize(&rewritten).as_ref(),
                Ok(&canonical),
                "serde_json's spelling of the same value: {}",
                String::from_utf8_lossy(&rewritten)
            );
        }
    }
    Input::Spelled { value, a, b } => {
        let (first, second) = (spelled(&value, a), spelled(&value, b));
        match (
            canonicalize(first.as_bytes()),
            canonicalize(second.as_bytes()),
        ) {
            (Ok(x), Ok(y)) => assert_eq!(x, y, "two spellings of one value:\n{first}\n{second}"),
            (Err(_), Err(_)) => {}
            (x, y) => panic!("one spelling refused:\n{first}\n=> {x:?}\n{second}\n=> {y:?}"),
        }
    }
});
