//! The on-disk record: a format byte, the scoped key, a bincode 2 body, and a crc32 that also
//! covers the scoped key, so a record copied under another key fails its check. Two body
//! layouts exist: [`format1`] (fixed-width integers, read only) and [`format2`] (what this build
//! writes: variable-width integers, times as offsets, the response optionally lz4-compressed).
//! `docs/format.md` lists the bytes of both.

pub(crate) mod format1;
mod format2;

use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use bincode::{Decode, Encode};

/// The record format this build writes. It reads this one and every older one.
pub(crate) const RECORD_FORMAT: u8 = format2::FORMAT;

/// The largest record body the decoder will allocate for; bounds the damage a corrupt length
/// field can do. Responses are capped below this by [`crate::MAX_RESPONSE_LIMIT`].
const DECODE_LIMIT: usize = 80 << 20;

/// How [`Record::encode`] stores a completed record's response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Packing {
    /// As it is.
    #[default]
    Plain,
    /// lz4-compressed when that saves at least [`format2::LZ4_MIN_SAVING`] bytes, as it is
    /// otherwise (`crate::StoreBuilder::compress_responses`).
    Lz4,
}

/// One record: the state of one scoped key.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Record {
    /// The fence of the claim that wrote this record.
    pub(crate) fence: u64,
    /// SHA-256 of the request, as the claim gave it.
    pub(crate) fingerprint: [u8; 32],
    /// When the claim was acquired, ms since the Unix epoch.
    pub(crate) claimed_at: u64,
    pub(crate) state: RecordState,
}

#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) enum RecordState {
    /// Claimed, not finished: the side effect may or may not have happened.
    InProgress {
        /// When the lease runs out, ms since the Unix epoch.
        lease_until: u64,
    },
    /// Finished: replay `response` until `expires_at`.
    Completed {
        completed_at: u64,
        expires_at: u64,
        response: StoredResponse,
    },
}

/// The fixed-size front of a record: everything the index needs, decoded without touching the
/// response.
#[derive(Debug, Clone, PartialEq, Eq, Decode)]
pub(crate) struct Head {
    pub(crate) fence: u64,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) claimed_at: u64,
    pub(crate) state: HeadState,
}

/// [`RecordState`]'s variants, up to the response.
#[derive(Debug, Clone, PartialEq, Eq, Decode)]
pub(crate) enum HeadState {
    InProgress { lease_until: u64 },
    Completed { completed_at: u64, expires_at: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

impl From<Response> for StoredResponse {
    fn from(r: Response) -> Self {
        StoredResponse {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl From<StoredResponse> for Response {
    fn from(r: StoredResponse) -> Self {
        Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }
    }
}

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeFailure {
    TooShort,
    Checksum { stored: u32, computed: u32 },
    Format(u8),
    Body(String),
}

impl std::fmt::Display for DecodeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeFailure::TooShort => write!(f, "value too short to hold a record"),
            DecodeFailure::Checksum { stored, computed } => write!(
                f,
                "crc32 mismatch (stored {stored:08x}, computed {computed:08x})"
            ),
            DecodeFailure::Format(v) => write!(f, "unknown record format {v}"),
            DecodeFailure::Body(e) => write!(f, "record body does not decode: {e}"),
        }
    }
}

impl Record {
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        Fingerprint::from_bytes(self.fingerprint)
    }

    /// What [`Record::decode_head`] reads of this record.
    #[cfg(test)]
    pub(crate) fn head(&self) -> Head {
        Head {
            fence: self.fence,
            fingerprint: self.fingerprint,
            claimed_at: self.claimed_at,
            state: match &self.state {
                RecordState::InProgress { lease_until } => HeadState::InProgress {
                    lease_until: *lease_until,
                },
                RecordState::Completed {
                    completed_at,
                    expires_at,
                    ..
                } => HeadState::Completed {
                    completed_at: *completed_at,
                    expires_at: *expires_at,
                },
            },
        }
    }

    /// `[format: u8][scoped key length: u16 LE][scoped key][body][crc32 LE of every byte before
    /// it]`, in [`RECORD_FORMAT`], for the record stored at its claim's fence. The record carries
    /// its own key because the table is keyed by fence.
    pub(crate) fn encode(&self, scoped_key: &[u8], packing: Packing) -> Vec<u8> {
        self.pack(packing).encode_at(self.fence, scoped_key)
    }

    /// The record with its response packed as `packing` asks (compressed, if that pays), to
    /// be encoded at a fence decided later: [`PackedRecord::encode_at`] then only copies and
    /// checksums.
    pub(crate) fn pack(&self, packing: Packing) -> PackedRecord<'_> {
        PackedRecord {
            record: self,
            response: format2::pack(self, packing),
        }
    }
    /// The scoped key a damaged value says it belongs to, unverified: for error messages only.
    pub(crate) fn unverified_key(value: &[u8]) -> Option<&[u8]> {
        let len = usize::from(u16::from_le_bytes([*value.get(1)?, *value.get(2)?]));
        value.get(3..3 + len)
    }

    /// Verifies and decodes a stored value, of any format this build reads, into its scoped key
    /// and record.
    #[cfg(test)]
    pub(crate) fn decode(value: &[u8]) -> Result<(&[u8], Record), DecodeFailure> {
        Record::decode_placed(value).map(|(key, record, _)| (key, record))
    }

    /// Verifies and decodes a stored value, of any format this build reads, into its scoped
    /// key, its record and the fence it says it is stored at (which the caller checks against
    /// the fence it was read at): its claim's, or a completion's own.
    pub(crate) fn decode_placed(value: &[u8]) -> Result<(&[u8], Record, u64), DecodeFailure> {
        let (format, key, body) = Record::frame(value)?;
        let (record, place) = match format {
            format1::FORMAT => {
                let record = format1::decode(body)?;
                let fence = record.fence;
                (record, fence)
            }
            _ => format2::decode(body)?,
        };
        Ok((key, record, place))
    }

    /// Verifies a stored value's checksum and decodes its scoped key, its [`Head`] and the
    /// fence it says it is stored at, leaving the response undecoded: what the open needs of
    /// every record. A response that does not decode despite a good checksum (which only a bug
    /// could write) is reported when it is read.
    pub(crate) fn decode_head(value: &[u8]) -> Result<(&[u8], Head, u64), DecodeFailure> {
        let (format, key, body) = Record::frame(value)?;
        let (head, place) = match format {
            format1::FORMAT => {
                let head = format1::decode_head(body)?;
                let fence = head.fence;
                (head, fence)
            }
            _ => format2::decode_head(body)?,
        };
        Ok((key, head, place))
    }

    /// Checks the checksum and the format byte, and splits the key from the body.
    fn frame(value: &[u8]) -> Result<(u8, &[u8], &[u8]), DecodeFailure> {
        let Some(split) = value.len().checked_sub(4).filter(|&n| n >= 3) else {
            return Err(DecodeFailure::TooShort);
        };
        let (payload, crc) = value.split_at(split);
        let stored = u32::from_le_bytes(crc.try_into().expect("four bytes"));
        let computed = crc32fast::hash(payload);
        if stored != computed {
            return Err(DecodeFailure::Checksum { stored, computed });
        }
        let format = payload[0];
        if format != format1::FORMAT && format != format2::FORMAT {
            return Err(DecodeFailure::Format(format));
        }
        let len = usize::from(u16::from_le_bytes([payload[1], payload[2]]));
        let (key, body) = payload[3..]
            .split_at_checked(len)
            .ok_or(DecodeFailure::TooShort)?;
        Ok((format, key, body))
    }
}

/// A record with its response packed ([`Record::pack`]).
pub(crate) struct PackedRecord<'a> {
    record: &'a Record,
    response: format2::PackedResponse,
}

impl PackedRecord<'_> {
    /// The stored value of the record at fence `place`: its claim's fence, or for a completed
    /// record a later one of its own (store format 7 on), which the value then names.
    pub(crate) fn encode_at(&self, place: u64, scoped_key: &[u8]) -> Vec<u8> {
        let mut out = frame_start(RECORD_FORMAT, scoped_key, self.response.len());
        format2::encode_body(self.record, &self.response, place, &mut out);
        frame_end(out)
    }
}

/// The format byte and the scoped key with its length: every format's first bytes. `response`
/// is the length of the response's encoding to follow, so the value is allocated once.
fn frame_start(format: u8, scoped_key: &[u8], response: usize) -> Vec<u8> {
    let len = u16::try_from(scoped_key.len()).expect("scoped keys are bounded");
    // Framing, fence, fingerprint, claim time, the state's variant and its varints, checksum.
    const FIXED: usize = 3 + 10 + 32 + 8 + 1 + 4 * 10 + 4;
    let mut out = Vec::with_capacity(FIXED + scoped_key.len() + response);
    out.push(format);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(scoped_key);
    out
}

/// Appends the checksum of everything written so far.
fn frame_end(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes all of `body` as a `T`: bytes left over are damage, as is a body that runs short.
fn decode_all<T: Decode<()>, C: bincode::config::Config>(
    body: &[u8],
    config: C,
) -> Result<T, DecodeFailure> {
    let (value, used) = bincode::decode_from_slice::<T, _>(body, config)
        .map_err(|e| DecodeFailure::Body(e.to_string()))?;
    if used != body.len() {
        return Err(DecodeFailure::Body(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(value)
}

/// Decodes the front of `body` as a `T`, ignoring what follows.
fn decode_front<T: Decode<()>, C: bincode::config::Config>(
    body: &[u8],
    config: C,
) -> Result<T, DecodeFailure> {
    bincode::decode_from_slice::<T, _>(body, config)
        .map(|(value, _)| value)
        .map_err(|e| DecodeFailure::Body(e.to_string()))
}

/// The records `docs/format.md` walks through, which each format's golden test pins.
#[cfg(test)]
mod worked {
    use super::{Record, RecordState, StoredResponse};

    /// `("t", "e", "k")`.
    pub(super) const KEY: &[u8] = b"\x01t\x00\x01ek";

    pub(super) fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub(super) fn in_progress() -> Record {
        Record {
            fence: 0x0102,
            fingerprint: [0x11; 32],
            claimed_at: 1_767_225_600_000,
            state: RecordState::InProgress {
                lease_until: 1_767_225_660_000,
            },
        }
    }

    pub(super) fn completed() -> Record {
        Record {
            fence: 7,
            fingerprint: [0x22; 32],
            claimed_at: 1,
            state: RecordState::Completed {
                completed_at: 2,
                expires_at: 3,
                response: StoredResponse {
                    status: 201,
                    headers: vec![("a".into(), b"bc".to_vec())],
                    body: b"ok".to_vec(),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The open decodes only the head; it must read the same fields as the full decode.
    #[test]
    fn the_head_decodes_the_same_fields_as_the_record() {
        let completed = Record {
            fence: 77,
            fingerprint: [9; 32],
            claimed_at: 1_000,
            state: RecordState::Completed {
                completed_at: 2_000,
                expires_at: 3_000,
                response: StoredResponse {
                    status: 201,
                    headers: vec![("a".into(), b"b".to_vec())],
                    body: b"body".to_vec(),
                },
            },
        };
        let in_progress = Record {
            state: RecordState::InProgress { lease_until: 5_000 },
            ..completed.clone()
        };
        for (record, state) in [
            (
                completed,
                HeadState::Completed {
                    completed_at: 2_000,
                    expires_at: 3_000,
                },
            ),
            (in_progress, HeadState::InProgress { lease_until: 5_000 }),
        ] {
            let value = record.encode(b"k", Packing::Plain);
            let (key, head, place) = Record::decode_head(&value).unwrap();
            assert_eq!((key, place), (&b"k"[..], 77));
            assert_eq!(
                head,
                Head {
                    fence: 77,
                    fingerprint: [9; 32],
                    claimed_at: 1_000,
                    state,
                }
            );
            let mut damaged = value.clone();
            damaged[5] ^= 1;
            assert!(matches!(
                Record::decode_head(&damaged),
                Err(DecodeFailure::Checksum { .. })
            ));
        }
    }

    fn completed() -> Record {
        Record {
            fence: 7,
            fingerprint: [0xAB; 32],
            claimed_at: 1_000,
            state: RecordState::Completed {
                completed_at: 2_000,
                expires_at: 3_000,
                response: StoredResponse {
                    status: 201,
                    headers: vec![("a".into(), b"b".to_vec())],
                    body: b"ok".to_vec(),
                },
            },
        }
    }

    #[test]
    fn round_trips() {
        let r = completed();
        let bytes = r.encode(b"key", Packing::Plain);
        assert_eq!(Record::decode(&bytes).unwrap(), (&b"key"[..], r));
    }

    #[test]
    fn crc_covers_the_key() {
        let mut bytes = completed().encode(b"key", Packing::Plain);
        bytes[5] = b'z';
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeFailure::Checksum { .. })
        ));
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let bytes = completed().encode(b"key", Packing::Plain);
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Record::decode(&b).is_err(), "bit {i}");
        }
        for n in 0..bytes.len() {
            assert!(Record::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn response_size_matches_encoding() {
        let r = Response::new(200, vec![1u8; 100])
            .with_header("x", "yy")
            .with_header("content-type", "a/b");
        let rec = Record {
            state: RecordState::Completed {
                completed_at: 0,
                expires_at: 0,
                response: r.clone().into(),
            },
            ..completed()
        };
        let empty = Record {
            state: RecordState::Completed {
                completed_at: 0,
                expires_at: 0,
                response: Response::new(0, Vec::new()).into(),
            },
            ..completed()
        };
        let delta = format1::encode(&rec, b"k").len() - format1::encode(&empty, b"k").len();
        assert_eq!(
            delta,
            r.encoded_size() - Response::new(0, Vec::new()).encoded_size()
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn any_record() -> impl Strategy<Value = Record> {
        let response = (
            any::<u16>(),
            proptest::collection::vec(
                (".{0,8}", proptest::collection::vec(any::<u8>(), 0..8)),
                0..4,
            ),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..64),
                // Compressible: lz4 takes these when asked.
                (any::<u8>(), 0..600usize).prop_map(|(b, n)| vec![b; n]),
            ],
        )
            .prop_map(|(status, headers, body)| StoredResponse {
                status,
                headers,
                body,
            });
        let state = prop_oneof![
            any::<u64>().prop_map(|lease_until| RecordState::InProgress { lease_until }),
            (any::<u64>(), any::<u64>(), response).prop_map(
                |(completed_at, expires_at, response)| {
                    RecordState::Completed {
                        completed_at,
                        expires_at,
                        response,
                    }
                }
            ),
        ];
        (any::<u64>(), any::<[u8; 32]>(), any::<u64>(), state).prop_map(
            |(fence, fingerprint, claimed_at, state)| Record {
                fence,
                fingerprint,
                claimed_at,
                state,
            },
        )
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(
            r in any_record(),
            key in proptest::collection::vec(any::<u8>(), 1..1300),
            packing in prop_oneof![Just(Packing::Plain), Just(Packing::Lz4)],
            apart in prop_oneof![Just(0u64), 1..200u64, Just(u64::MAX)],
        ) {
            let bytes = r.encode(&key, packing);
            prop_assert_eq!(Record::decode(&bytes).unwrap(), (&key[..], r.clone()));
            let head = Record::decode_head(&bytes).unwrap();
            prop_assert_eq!(head, (&key[..], r.head(), r.fence));
            // A completion stored at a fence of its own says where.
            if let (RecordState::Completed { .. }, Some(place)) = (&r.state, r.fence.checked_add(apart)) {
                let bytes = r.pack(packing).encode_at(place, &key);
                prop_assert_eq!(Record::decode_placed(&bytes).unwrap(), (&key[..], r.clone(), place));
                prop_assert_eq!(Record::decode_head(&bytes).unwrap(), (&key[..], r.head(), place));
            }
            // What a store of format 5 or before wrote still reads the same.
            let old = format1::encode(&r, &key);
            prop_assert_eq!(Record::decode(&old).unwrap(), (&key[..], r.clone()));
            prop_assert_eq!(Record::decode_head(&old).unwrap().1, r.head());
        }

        /// Damaged values never panic and never decode under a checksum that was not theirs.
        #[test]
        fn arbitrary_bytes_never_panic(value in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Record::decode(&value);
        }

        /// A compressed response damaged under a valid checksum (only a bug could write one)
        /// fails as a typed error, never a panic or a response other than the one written.
        #[test]
        fn damaged_compressed_responses_never_panic(
            pattern in proptest::collection::vec(any::<u8>(), 4..16),
            repeats in 16..40usize,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let record = Record {
                fence: 9,
                fingerprint: [3; 32],
                claimed_at: 1,
                state: RecordState::Completed {
                    completed_at: 2,
                    expires_at: 3,
                    response: StoredResponse { status: 200, headers: vec![], body: pattern.repeat(repeats) },
                },
            };
            let mut value = record.encode(b"k", Packing::Lz4);
            prop_assert!(value.len() < record.encode(b"k", Packing::Plain).len());
            let crc_at = value.len() - 4;
            // Damage after the key and the fixed fields: the lengths and the lz4 block.
            let from = 3 + 1 + 1 + 32 + 8;
            for (at, bits) in flips {
                let i = from + at.index(crc_at - from);
                value[i] ^= bits;
            }
            let crc = crc32fast::hash(&value[..crc_at]);
            value[crc_at..].copy_from_slice(&crc.to_le_bytes());
            if let Ok((_, decoded)) = Record::decode(&value) {
                // A flip that lands on a literal can still decode: then it is another body,
                // never a panic; the record's checksum is what keeps that from a real store.
                prop_assert_eq!(decoded.fence, 9);
            }
        }

        /// A body whose checksum is valid but whose lengths lie must still fail cleanly.
        #[test]
        fn valid_checksum_over_garbage_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut value = vec![if body.first().is_some_and(|b| b & 1 == 1) { 1 } else { RECORD_FORMAT }];
            value.extend_from_slice(&body);
            let crc = crc32fast::hash(&value);
            value.extend_from_slice(&crc.to_le_bytes());
            let _ = Record::decode(&value);
        }
    }

    #[test]
    fn huge_declared_length_fails_without_allocating_it() {
        let r = Record {
            fence: 1,
            fingerprint: [0; 32],
            claimed_at: 0,
            state: RecordState::Completed {
                completed_at: 0,
                expires_at: 0,
                response: StoredResponse {
                    status: 200,
                    headers: vec![],
                    body: b"x".to_vec(),
                },
            },
        };
        let mut value = format1::encode(&r, b"k");
        value.truncate(value.len() - 4);
        // The body length is the 8 bytes before the last body byte: claim u64::MAX / 2.
        let at = value.len() - 9;
        value[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let crc = crc32fast::hash(&value);
        value.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Record::decode(&value),
            Err(DecodeFailure::Body(_))
        ));
    }
}
