//! A record as an engine reads it, with its times exact (milliseconds since the epoch): what a
//! scan lists, an export writes and an import keeps. With feature `export`, [`Moved::to_line`]
//! and [`Moved::from_line`] are the export's JSON lines; the line format is in
//! `docs/postgres.md` ("Moving from a file").

use crate::clock::from_millis;
use crate::model::claim::{Entry, EntryState};
use crate::model::fingerprint::Fingerprint;
use crate::model::listing::ListedRecord;
use crate::model::response::Response;
use crate::model::scope::Scope;

/// A record as an engine read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Moved {
    pub(crate) scope: Scope,
    pub(crate) key: String,
    pub(crate) fence: u64,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) claimed_at: u64,
    pub(crate) state: MovedState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MovedState {
    InProgress {
        lease_until: u64,
    },
    Completed {
        completed_at: u64,
        expires_at: u64,
        response: Response,
    },
}

impl Moved {
    /// The record as a scan lists it, with `orphan` (which only the engine knows) at `now`.
    pub(crate) fn listed(self, orphan: bool, now: u64) -> ListedRecord {
        let state = match self.state {
            MovedState::InProgress { lease_until } => EntryState::InProgress {
                lease_deadline: from_millis(lease_until),
                orphan,
            },
            MovedState::Completed {
                expires_at,
                response,
                ..
            } => EntryState::Completed {
                expires_at: from_millis(expires_at),
                response,
            },
        };
        let entry = Entry {
            fence: self.fence,
            fingerprint: self.fingerprint,
            claimed_at: from_millis(self.claimed_at),
            state,
        };
        ListedRecord {
            scope: self.scope,
            key: self.key,
            status: entry.status_at(from_millis(now)),
            entry,
        }
    }
}

/// The export's JSON lines.
#[cfg(feature = "export")]
mod line {
    use super::{Moved, MovedState};
    use crate::error::{Error, Result};
    use crate::model::fingerprint::Fingerprint;
    use crate::model::response::Response;
    use crate::model::scope::{validate_key, Scope};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// The version every exported line carries; an import refuses any other.
    const LINE_VERSION: u64 = 1;

    /// One line as JSON: an in-progress record has `lease_until`, a completed one the
    /// completion's fields. Bytes (the fingerprint, header values, the body) are lower-case
    /// hexadecimal. Unknown fields are ignored.
    #[derive(Serialize, Deserialize)]
    struct Line {
        v: u64,
        tenant: String,
        endpoint: String,
        key: String,
        fence: u64,
        fingerprint: Hex,
        claimed_at: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_until: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        completed_at: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<u64>,
        /// Wider than a status, so that an out-of-range one is refused by name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        headers: Option<Vec<(String, Hex)>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Hex>,
    }

    /// Bytes written as hexadecimal text.
    struct Hex(Vec<u8>);

    impl Serialize for Hex {
        fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use std::fmt::Write as _;
            let mut out = String::with_capacity(self.0.len() * 2);
            for b in &self.0 {
                let _ = write!(out, "{b:02x}");
            }
            s.serialize_str(&out)
        }
    }

    impl<'de> Deserialize<'de> for Hex {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Hex, D::Error> {
            let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            let bytes = text.as_bytes();
            if !bytes.len().is_multiple_of(2) {
                return Err(serde::de::Error::custom("a byte string is not hexadecimal"));
            }
            bytes
                .chunks(2)
                .map(|pair| {
                    std::str::from_utf8(pair)
                        .ok()
                        .and_then(|digits| u8::from_str_radix(digits, 16).ok())
                })
                .collect::<Option<Vec<u8>>>()
                .map(Hex)
                .ok_or_else(|| serde::de::Error::custom("a byte string is not hexadecimal"))
        }
    }

    impl Moved {
        /// The record as one JSON line (without the newline).
        pub(crate) fn to_line(&self) -> String {
            let mut line = Line {
                v: LINE_VERSION,
                tenant: self.scope.tenant().to_owned(),
                endpoint: self.scope.endpoint().to_owned(),
                key: self.key.clone(),
                fence: self.fence,
                fingerprint: Hex(self.fingerprint.as_bytes().to_vec()),
                claimed_at: self.claimed_at,
                lease_until: None,
                completed_at: None,
                expires_at: None,
                status: None,
                headers: None,
                body: None,
            };
            match &self.state {
                MovedState::InProgress { lease_until } => line.lease_until = Some(*lease_until),
                MovedState::Completed {
                    completed_at,
                    expires_at,
                    response,
                } => {
                    line.completed_at = Some(*completed_at);
                    line.expires_at = Some(*expires_at);
                    line.status = Some(u64::from(response.status));
                    line.headers = Some(
                        response
                            .headers
                            .iter()
                            .map(|(name, value)| (name.clone(), Hex(value.clone())))
                            .collect(),
                    );
                    line.body = Some(Hex(response.body.clone()));
                }
            }
            serde_json::to_string(&line).expect("a line of strings and numbers encodes")
        }

        /// A record from one JSON line; `line` numbers the error.
        pub(crate) fn from_line(text: &str, line: u64) -> Result<Moved> {
            let bad = |reason: String| Error::InvalidImport { line, reason };
            let l: Line = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
            let need =
                |value: Option<u64>, name: &str| value.ok_or_else(|| bad(format!("no \"{name}\"")));
            if l.v != LINE_VERSION {
                return Err(bad(format!("not a version {LINE_VERSION} line")));
            }
            let scope = Scope::new(l.tenant, l.endpoint);
            scope.validate().map_err(|e| bad(e.to_string()))?;
            validate_key(&l.key).map_err(|e| bad(e.to_string()))?;
            let fingerprint = <[u8; 32]>::try_from(l.fingerprint.0)
                .map(Fingerprint::from_bytes)
                .map_err(|_| bad("\"fingerprint\" is not 32 bytes".into()))?;
            if l.fence == 0 || i64::try_from(l.fence).is_err() {
                return Err(bad("\"fence\" is out of range".into()));
            }
            let state = match l.lease_until {
                Some(lease_until) => MovedState::InProgress { lease_until },
                None => MovedState::Completed {
                    completed_at: need(l.completed_at, "completed_at")?,
                    expires_at: need(l.expires_at, "expires_at")?,
                    response: Response {
                        status: u16::try_from(need(l.status, "status")?)
                            .map_err(|_| bad("\"status\" is out of range".into()))?,
                        headers: l
                            .headers
                            .ok_or_else(|| bad("no \"headers\"".into()))?
                            .into_iter()
                            .map(|(name, value)| (name, value.0))
                            .collect(),
                        body: l.body.ok_or_else(|| bad("no \"body\"".into()))?.0,
                    },
                },
            };
            Ok(Moved {
                scope,
                key: l.key,
                fence: l.fence,
                fingerprint,
                claimed_at: l.claimed_at,
                state,
            })
        }
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
}
