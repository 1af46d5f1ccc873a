//! Moving a store's live records to another store: [`crate::Store::export`] writes them as JSON
//! lines, [`crate::Store::import`] reads them into an empty store. The line format is in
//! `docs/postgres.md` ("Moving from a file").

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::listing::{Moved, MovedState};
use crate::response::Response;
use crate::scope::{validate_key, Scope};
use serde_json::{json, Value};

/// The version every exported line carries; an import refuses any other.
const LINE_VERSION: u64 = 1;

impl Moved {
    /// The record as one JSON line (without the newline).
    pub(crate) fn to_line(&self) -> String {
        let mut v = json!({
            "v": LINE_VERSION,
            "tenant": self.scope.tenant(),
            "endpoint": self.scope.endpoint(),
            "key": self.key,
            "fence": self.fence,
            "fingerprint": hex(self.fingerprint.as_bytes()),
            "claimed_at": self.claimed_at,
        });
        let fields = v.as_object_mut().expect("an object");
        match &self.state {
            MovedState::InProgress { lease_until } => {
                fields.insert("lease_until".into(), json!(lease_until));
            }
            MovedState::Completed {
                completed_at,
                expires_at,
                response,
            } => {
                fields.insert("completed_at".into(), json!(completed_at));
                fields.insert("expires_at".into(), json!(expires_at));
                fields.insert("status".into(), json!(response.status));
                let headers: Vec<Value> = response
                    .headers
                    .iter()
                    .map(|(name, value)| json!([name, hex(value)]))
                    .collect();
                fields.insert("headers".into(), Value::Array(headers));
                fields.insert("body".into(), json!(hex(&response.body)));
            }
        }
        v.to_string()
    }

    /// A record from one JSON line; `line` numbers the error.
    pub(crate) fn from_line(text: &str, line: u64) -> Result<Moved> {
        let bad = |reason: String| Error::InvalidImport { line, reason };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let field = |name: &str| v.get(name).ok_or_else(|| bad(format!("no \"{name}\"")));
        let number = |name: &str| {
            field(name)?
                .as_u64()
                .ok_or_else(|| bad(format!("\"{name}\" is not a non-negative integer")))
        };
        let text_of = |name: &str| {
            field(name)?
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("\"{name}\" is not a string")))
        };
        let bytes_of = |name: &str, value: &Value| {
            value
                .as_str()
                .and_then(unhex)
                .ok_or_else(|| bad(format!("\"{name}\" is not hexadecimal")))
        };
        if number("v")? != LINE_VERSION {
            return Err(bad(format!("not a version {LINE_VERSION} line")));
        }
        let scope = Scope::new(text_of("tenant")?, text_of("endpoint")?);
        scope.validate().map_err(|e| bad(e.to_string()))?;
        let key = text_of("key")?;
        validate_key(&key).map_err(|e| bad(e.to_string()))?;
        let fingerprint = <[u8; 32]>::try_from(bytes_of("fingerprint", field("fingerprint")?)?)
            .map(Fingerprint::from_bytes)
            .map_err(|_| bad("\"fingerprint\" is not 32 bytes".into()))?;
        let fence = number("fence")?;
        if fence == 0 || i64::try_from(fence).is_err() {
            return Err(bad("\"fence\" is out of range".into()));
        }
        let state = if v.get("lease_until").is_some() {
            MovedState::InProgress {
                lease_until: number("lease_until")?,
            }
        } else {
            let status = u16::try_from(number("status")?)
                .map_err(|_| bad("\"status\" is out of range".into()))?;
            let headers = field("headers")?
                .as_array()
                .ok_or_else(|| bad("\"headers\" is not an array".into()))?
                .iter()
                .map(|pair| match pair.as_array().map(Vec::as_slice) {
                    Some([name, value]) => Ok((
                        name.as_str()
                            .ok_or_else(|| bad("a header name is not a string".into()))?
                            .to_owned(),
                        bytes_of("headers", value)?,
                    )),
                    _ => Err(bad("a header is not a [name, value] pair".into())),
                })
                .collect::<Result<Vec<_>>>()?;
            MovedState::Completed {
                completed_at: number("completed_at")?,
                expires_at: number("expires_at")?,
                response: Response {
                    status,
                    headers,
                    body: bytes_of("body", field("body")?)?,
                },
            }
        };
        Ok(Moved {
            scope,
            key,
            fence,
            fingerprint,
            claimed_at: number("claimed_at")?,
            state,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Reads every line of `input` into records, refusing the whole input at its first bad line.
#[cfg(feature = "postgres")]
pub(crate) fn read_lines(input: impl std::io::BufRead) -> Result<Vec<Moved>> {
    let mut out = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line_no = u64::try_from(n + 1).unwrap_or(u64::MAX);
        let line = line.map_err(Error::Io)?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(Moved::from_line(&line, line_no)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed() -> Moved {
        Moved {
            scope: Scope::new("t\u{0}é", "POST /x"),
            key: "k-1".into(),
            fence: 7,
            fingerprint: Fingerprint::of(b"x"),
            claimed_at: 1,
            state: MovedState::Completed {
                completed_at: 2,
                expires_at: 3,
                response: Response::new(201, vec![0, 255, b'"'])
                    .with_header("set-cookie", "a=1")
                    .with_header("x-raw", vec![0x80]),
            },
        }
    }

    #[test]
    fn lines_round_trip_every_state_and_byte() {
        let held = Moved {
            state: MovedState::InProgress { lease_until: 99 },
            ..completed()
        };
        for m in [completed(), held] {
            let line = m.to_line();
            assert!(!line.contains('\n'));
            assert_eq!(Moved::from_line(&line, 1).unwrap(), m);
        }
    }

    #[test]
    fn bad_lines_are_typed_errors_that_name_the_line() {
        let good = completed().to_line();
        for (bad, why) in [
            ("{".to_owned(), "EOF"),
            (good.replace("\"v\":1", "\"v\":2"), "version"),
            (
                good.replace("\"key\":\"k-1\"", "\"key\":\"has space\""),
                "key",
            ),
            (good.replace("\"fence\":7", "\"fence\":0"), "fence"),
            (good.replace("\"status\":201", "\"status\":70000"), "status"),
            (
                good.replace("\"body\":\"00ff22\"", "\"body\":\"0g\""),
                "hexadecimal",
            ),
        ] {
            match Moved::from_line(&bad, 42) {
                Err(Error::InvalidImport { line: 42, reason }) => {
                    assert!(reason.contains(why), "{why}: {reason}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
