//! Record format 2, what this build writes (store format 6 on): the body is bincode 2 with
//! variable-width integers, times after the claim's as offsets from the time before them, and
//! the response either as it is or lz4-compressed, which its variant says. From store format 7
//! a completed record may be stored apart from its claim, at a fence of its own, which its
//! state's variant says with the distance between the two.

use super::{decode_all, decode_front, DecodeFailure, Head, HeadState, Packing, Record};
use super::{RecordState, StoredResponse, DECODE_LIMIT};
use bincode::{Decode, Encode};

pub(super) const FORMAT: u8 = 2;

/// A response is stored compressed only when that saves at least this many bytes: below it,
/// decompressing at every replay costs more than the bytes are worth.
pub(super) const LZ4_MIN_SAVING: usize = 16;

/// Responses whose encoding is shorter than this are never compressed.
const LZ4_MIN_INPUT: usize = 64;

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<DECODE_LIMIT>,
>;

const CONFIG: Config = bincode::config::standard()
    .with_little_endian()
    .with_variable_int_encoding()
    .with_limit::<DECODE_LIMIT>();

/// The body as written: borrows the record. [`Body`] is the same layout, decoded.
#[derive(Encode)]
struct BodyRef<'a> {
    fence: u64,
    fingerprint: &'a [u8; 32],
    /// Fixed width: a time in ms takes 9 bytes as a varint.
    claimed_at: [u8; 8],
    state: StateRef<'a>,
}

#[derive(Encode)]
enum StateRef<'a> {
    InProgress {
        /// `lease_until - claimed_at`, wrapping (a clock set back makes it large, never wrong).
        lease_for: u64,
    },
    Completed {
        /// `completed_at - claimed_at`, wrapping.
        completed_after: u64,
        /// `expires_at - completed_at`, wrapping.
        ttl: u64,
        response: ResponseRef<'a>,
    },
    /// Completed, and stored at a fence of its own: `fence + placed_after` (store format 7 on).
    CompletedApart {
        /// Above zero: a completion at its claim's fence is `Completed`.
        placed_after: u64,
        completed_after: u64,
        ttl: u64,
        response: ResponseRef<'a>,
    },
}

#[derive(Encode)]
enum ResponseRef<'a> {
    Plain(Fields<'a>),
    /// The lz4 block of the response's `Plain` encoding (without the variant), `length` bytes
    /// when decompressed.
    Lz4 {
        length: u64,
        packed: &'a [u8],
    },
}

/// A `Plain` response's fields: the response, or its encoding already made (by a compression
/// that did not pay), written as it is rather than encoded a second time.
enum Fields<'a> {
    Response(&'a StoredResponse),
    Encoded(&'a [u8]),
}

impl Encode for Fields<'_> {
    fn encode<E: bincode::enc::Encoder>(
        &self,
        encoder: &mut E,
    ) -> Result<(), bincode::error::EncodeError> {
        use bincode::enc::write::Writer;
        match self {
            Fields::Response(response) => response.encode(encoder),
            Fields::Encoded(bytes) => encoder.writer().write(bytes),
        }
    }
}

/// What [`compress`] made of a response's encoding.
enum Compressed {
    /// The lz4 block, and the encoding's length.
    Lz4 { length: u64, packed: Vec<u8> },
    /// Compression saves too little: the encoding, to be stored as it is.
    No(Vec<u8>),
}

#[derive(Decode)]
struct Body {
    fence: u64,
    fingerprint: [u8; 32],
    claimed_at: [u8; 8],
    state: State,
}

#[derive(Decode)]
enum State {
    InProgress {
        lease_for: u64,
    },
    Completed {
        completed_after: u64,
        ttl: u64,
        response: Packed,
    },
    CompletedApart {
        placed_after: u64,
        completed_after: u64,
        ttl: u64,
        response: Packed,
    },
}

#[derive(Decode)]
enum Packed {
    Plain(StoredResponse),
    Lz4 { length: u64, packed: Vec<u8> },
}

/// [`Body`] up to the response: what the open decodes.
#[derive(Decode)]
struct BodyHead {
    fence: u64,
    fingerprint: [u8; 32],
    claimed_at: [u8; 8],
    state: StateHead,
}

#[derive(Decode)]
enum StateHead {
    InProgress {
        lease_for: u64,
    },
    Completed {
        completed_after: u64,
        ttl: u64,
    },
    CompletedApart {
        placed_after: u64,
        completed_after: u64,
        ttl: u64,
    },
}

/// A completed record's response encoded, and compressed if [`Packing`] asks and that pays,
/// before the record is encoded: `None` for a record in progress. Encoding the record is then a
/// copy of these bytes, not an encoding of the response's fields (a completion is encoded under
/// the commit queue's lock).
pub(crate) struct PackedResponse(Option<Compressed>);

impl PackedResponse {
    /// The bytes the response takes in the record, within a few (the lz4 block's length).
    pub(super) fn len(&self) -> usize {
        match &self.0 {
            None => 0,
            Some(Compressed::No(encoded)) => encoded.len(),
            Some(Compressed::Lz4 { packed, .. }) => packed.len() + 10,
        }
    }
}

pub(super) fn pack(record: &Record, packing: Packing) -> PackedResponse {
    PackedResponse(match (&record.state, packing) {
        (RecordState::Completed { response, .. }, Packing::Lz4) => Some(compress(response)),
        (RecordState::Completed { response, .. }, Packing::Plain) => Some(Compressed::No(
            bincode::encode_to_vec(response, CONFIG).expect("encoding into a Vec cannot fail"),
        )),
        (RecordState::InProgress { .. }, _) => None,
    })
}

/// Encodes `record`'s body, with its response as `packed`, for the record stored at fence
/// `place`: its claim's fence, or (a completed record only) a later one.
pub(super) fn encode_body(record: &Record, packed: &PackedResponse, place: u64, out: &mut Vec<u8>) {
    let claimed_at = record.claimed_at;
    let state = match &record.state {
        RecordState::InProgress { lease_until } => {
            debug_assert_eq!(place, record.fence, "a claim is stored at its own fence");
            StateRef::InProgress {
                lease_for: lease_until.wrapping_sub(claimed_at),
            }
        }
        RecordState::Completed {
            completed_at,
            expires_at,
            response,
        } => {
            let completed_after = completed_at.wrapping_sub(claimed_at);
            let ttl = expires_at.wrapping_sub(*completed_at);
            let response = match &packed.0 {
                Some(Compressed::Lz4 { length, packed }) => ResponseRef::Lz4 {
                    length: *length,
                    packed,
                },
                Some(Compressed::No(encoded)) => ResponseRef::Plain(Fields::Encoded(encoded)),
                None => ResponseRef::Plain(Fields::Response(response)),
            };
            match place.checked_sub(record.fence) {
                Some(0) => StateRef::Completed {
                    completed_after,
                    ttl,
                    response,
                },
                Some(placed_after) => StateRef::CompletedApart {
                    placed_after,
                    completed_after,
                    ttl,
                    response,
                },
                None => unreachable!("a completion is stored at or after its claim's fence"),
            }
        }
    };
    let body = BodyRef {
        fence: record.fence,
        fingerprint: &record.fingerprint,
        claimed_at: claimed_at.to_le_bytes(),
        state,
    };
    bincode::encode_into_std_write(body, out, CONFIG).expect("encoding into a Vec cannot fail");
}

/// The response's encoding, compressed when that saves enough.
fn compress(response: &StoredResponse) -> Compressed {
    let raw = bincode::encode_to_vec(response, CONFIG).expect("encoding into a Vec cannot fail");
    if raw.len() < LZ4_MIN_INPUT {
        return Compressed::No(raw);
    }
    let packed = lz4_flex::block::compress(&raw);
    if packed.len() + LZ4_MIN_SAVING <= raw.len() {
        Compressed::Lz4 {
            length: raw.len() as u64,
            packed,
        }
    } else {
        Compressed::No(raw)
    }
}

fn decompress(length: u64, packed: &[u8]) -> Result<StoredResponse, DecodeFailure> {
    let length = usize::try_from(length)
        .ok()
        .filter(|&n| n <= DECODE_LIMIT)
        .ok_or_else(|| DecodeFailure::Body(format!("a compressed response of {length} bytes")))?;
    let raw = lz4_flex::block::decompress(packed, length)
        .map_err(|e| DecodeFailure::Body(format!("the compressed response: {e}")))?;
    if raw.len() != length {
        return Err(DecodeFailure::Body(format!(
            "the compressed response is {} bytes, not the {length} it says",
            raw.len()
        )));
    }
    decode_all(&raw, CONFIG)
}

/// Decodes a body into its record and the fence it says it is stored at.
pub(super) fn decode(body: &[u8]) -> Result<(Record, u64), DecodeFailure> {
    let body: Body = decode_all(body, CONFIG)?;
    let claimed_at = u64::from_le_bytes(body.claimed_at);
    let (state, placed_after) = match body.state {
        State::InProgress { lease_for } => (
            RecordState::InProgress {
                lease_until: claimed_at.wrapping_add(lease_for),
            },
            0,
        ),
        State::Completed {
            completed_after,
            ttl,
            response,
        } => (completed(claimed_at, completed_after, ttl, response)?, 0),
        State::CompletedApart {
            placed_after,
            completed_after,
            ttl,
            response,
        } => (
            completed(claimed_at, completed_after, ttl, response)?,
            apart(placed_after)?,
        ),
    };
    let place = placed(body.fence, placed_after)?;
    let record = Record {
        fence: body.fence,
        fingerprint: body.fingerprint,
        claimed_at,
        state,
    };
    Ok((record, place))
}

fn completed(
    claimed_at: u64,
    completed_after: u64,
    ttl: u64,
    response: Packed,
) -> Result<RecordState, DecodeFailure> {
    let completed_at = claimed_at.wrapping_add(completed_after);
    Ok(RecordState::Completed {
        completed_at,
        expires_at: completed_at.wrapping_add(ttl),
        response: match response {
            Packed::Plain(response) => response,
            Packed::Lz4 { length, packed } => decompress(length, &packed)?,
        },
    })
}

/// A completion apart from its claim is at least one fence after it: one encoding per record.
fn apart(placed_after: u64) -> Result<u64, DecodeFailure> {
    if placed_after == 0 {
        return Err(DecodeFailure::Body(
            "a completion apart from its claim at its claim's fence".into(),
        ));
    }
    Ok(placed_after)
}

fn placed(fence: u64, placed_after: u64) -> Result<u64, DecodeFailure> {
    fence
        .checked_add(placed_after)
        .ok_or_else(|| DecodeFailure::Body(format!("fence {fence} + {placed_after} is past 2^64")))
}

/// Decodes a body's front into its [`Head`] and the fence it says it is stored at.
pub(super) fn decode_head(body: &[u8]) -> Result<(Head, u64), DecodeFailure> {
    let head: BodyHead = decode_front(body, CONFIG)?;
    let claimed_at = u64::from_le_bytes(head.claimed_at);
    let completed = |completed_after: u64, ttl: u64| {
        let completed_at = claimed_at.wrapping_add(completed_after);
        HeadState::Completed {
            completed_at,
            expires_at: completed_at.wrapping_add(ttl),
        }
    };
    let (state, placed_after) = match head.state {
        StateHead::InProgress { lease_for } => (
            HeadState::InProgress {
                lease_until: claimed_at.wrapping_add(lease_for),
            },
            0,
        ),
        StateHead::Completed {
            completed_after,
            ttl,
        } => (completed(completed_after, ttl), 0),
        StateHead::CompletedApart {
            placed_after,
            completed_after,
            ttl,
        } => (completed(completed_after, ttl), apart(placed_after)?),
    };
    let place = placed(head.fence, placed_after)?;
    let head = Head {
        fence: head.fence,
        fingerprint: head.fingerprint,
        claimed_at,
        state,
    };
    Ok((head, place))
}

/// Pins format 2 byte for byte (`docs/format.md` walks through these bytes). If this test
/// fails, the format changed: add a format and keep this one's decoder, never edit the expected
/// bytes to match.
#[cfg(test)]
mod golden {
    use super::super::worked::{self, hex, KEY};
    use super::super::Record as R;
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn in_progress_record_bytes() {
        let r = worked::in_progress();
        let expect = concat!(
            "02",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "fb0201",                                                           // fence (u16)
            "1111111111111111111111111111111111111111111111111111111111111111", // fingerprint
            "00a8da769b010000",                                                 // claimed_at
            "00",                                                               // InProgress
            "fb60ea", // lease_for 60 s (u16)
        );
        let bytes = r.encode(KEY, Packing::Plain);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(hex(body), expect);
        assert_eq!(hex(crc), "38778287");
        assert_eq!(R::decode(&bytes).unwrap(), (KEY, r));
    }

    #[test]
    fn completed_record_bytes() {
        let r = worked::completed();
        let expect = concat!(
            "02",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "07",                                                               // fence
            "2222222222222222222222222222222222222222222222222222222222222222", // fingerprint
            "0100000000000000",                                                 // claimed_at
            "01",                                                               // Completed
            "01",                                                               // completed_after
            "01",                                                               // ttl
            "00",                                                               // Plain
            "c9",                                                               // status 201
            "01",                                                               // 1 header
            "0161",                                                             // "a"
            "026263",                                                           // "bc"
            "026f6b",                                                           // body "ok"
        );
        // Compression is asked for, and not used: the response is too short to gain.
        let bytes = r.encode(KEY, Packing::Lz4);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(hex(body), expect);
        assert_eq!(hex(crc), "eba8fc36");
        assert_eq!(R::decode(&bytes).unwrap(), (KEY, r));
    }

    /// A completion stored apart from its claim (store format 7 on): the state's third
    /// variant, with the distance from the claim's fence to the fence it is stored at.
    #[test]
    fn completed_apart_record_bytes() {
        let r = worked::completed();
        let expect = concat!(
            "02",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "07",                                                               // claim's fence
            "2222222222222222222222222222222222222222222222222222222222222222", // fingerprint
            "0100000000000000",                                                 // claimed_at
            "02",                                                               // CompletedApart
            "02",                                                               // placed_after
            "01",                                                               // completed_after
            "01",                                                               // ttl
            "00",                                                               // Plain
            "c9",                                                               // status 201
            "01",                                                               // 1 header
            "0161",                                                             // "a"
            "026263",                                                           // "bc"
            "026f6b",                                                           // body "ok"
        );
        let bytes = r.pack(Packing::Plain).encode_at(9, KEY);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(hex(body), expect);
        assert_eq!(hex(crc), "50126180");
        assert_eq!(R::decode_placed(&bytes).unwrap(), (KEY, r.clone(), 9));
        let (_, head, place) = R::decode_head(&bytes).unwrap();
        assert_eq!((head, place), (r.head(), 9));
    }

    /// A compressed response: these bytes must decode to this record whatever the compressor
    /// writes today (lz4's block format is fixed; one compressor's output is not).
    #[test]
    fn compressed_record_decodes() {
        let body = b"abcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcd";
        let mut r = worked::completed();
        let RecordState::Completed { response, .. } = &mut r.state else {
            unreachable!("the worked record is completed")
        };
        *response = StoredResponse {
            status: 200,
            headers: vec![],
            body: body.to_vec(),
        };
        let bytes = r.encode(KEY, Packing::Lz4);
        assert!(bytes.len() < r.encode(KEY, Packing::Plain).len());
        let stored = unhex(concat!(
            "02",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "07",                                                               // fence
            "2222222222222222222222222222222222222222222222222222222222222222", // fingerprint
            "0100000000000000",                                                 // claimed_at
            "01",                                                               // Completed
            "01",                                                               // completed_after
            "01",                                                               // ttl
            "01",                                                               // Lz4
            "4f",                                                               // 79 bytes raw
            "12",                                                               // 18 bytes packed:
            "7f",             // token: 7 literals, then a match of 4 + 15 + more
            "c8004c61626364", // the literals: status 200, no headers, body of 76, "abcd"
            "0400",           // the match 4 bytes back
            "2f",             // 47 more: a match of 4 + 15 + 47 = 66 bytes
            "60",             // the last token: 6 literals, no match
            "636461626364",   // "cdabcd"
            "8eb125e2",       // crc32
        ));
        assert_eq!(R::decode(&stored).unwrap(), (KEY, r));
    }
}

#[cfg(test)]
mod damage {
    use super::super::{frame_end, frame_start, Record};
    use super::*;

    /// A compressed response whose stated length is past the decoder's limit is refused before
    /// anything is allocated for it (a length that lies would otherwise make the decoder ask for
    /// up to 2^64 bytes); one within the limit that does not match the block is refused too.
    #[test]
    fn a_compressed_length_that_lies_is_refused() {
        for (length, says) in [
            (u64::MAX / 2, "a compressed response of"),
            (DECODE_LIMIT as u64 + 1, "a compressed response of"),
            (1000, "the compressed response"),
        ] {
            let body = BodyRef {
                fence: 7,
                fingerprint: &[1; 32],
                claimed_at: 1u64.to_le_bytes(),
                state: StateRef::Completed {
                    completed_after: 1,
                    ttl: 1,
                    response: ResponseRef::Lz4 {
                        length,
                        packed: &lz4_flex::block::compress(b"\xc8\x00\x02ok"),
                    },
                },
            };
            let mut value = frame_start(FORMAT, b"k", 0);
            bincode::encode_into_std_write(body, &mut value, CONFIG).unwrap();
            let value = frame_end(value);
            match Record::decode(&value) {
                Err(DecodeFailure::Body(why)) => assert!(why.contains(says), "{length}: {why}"),
                other => panic!("{length}: {other:?}"),
            }
        }
    }

    /// A completion apart from its claim must be stored after it, and within the fences: a
    /// distance of zero (a second encoding of `Completed`) or one past 2^64 is refused, by the
    /// head's decoder as by the record's.
    #[test]
    fn a_completion_apart_at_no_distance_or_past_the_fences_is_refused() {
        for (fence, placed_after, says) in [
            (7, 0, "at its claim's fence"),
            (u64::MAX - 1, 2, "past 2^64"),
        ] {
            let response = StoredResponse {
                status: 200,
                headers: vec![],
                body: b"ok".to_vec(),
            };
            let body = BodyRef {
                fence,
                fingerprint: &[1; 32],
                claimed_at: 1u64.to_le_bytes(),
                state: StateRef::CompletedApart {
                    placed_after,
                    completed_after: 1,
                    ttl: 1,
                    response: ResponseRef::Plain(Fields::Response(&response)),
                },
            };
            let mut value = frame_start(FORMAT, b"k", 0);
            bincode::encode_into_std_write(body, &mut value, CONFIG).unwrap();
            let value = frame_end(value);
            match Record::decode(&value) {
                Err(DecodeFailure::Body(why)) => assert!(why.contains(says), "{why}"),
                other => panic!("{placed_after}: {other:?}"),
            }
            match Record::decode_head(&value) {
                Err(DecodeFailure::Body(why)) => assert!(why.contains(says), "{why}"),
                other => panic!("{placed_after}: {other:?}"),
            }
        }
    }
}
