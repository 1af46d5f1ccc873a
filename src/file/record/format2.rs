//! Record format 2, what this build writes (store format 6 on): the body is bincode 2 with
//! variable-width integers, times after the claim's as offsets from the time before them, and
//! the response either as it is or lz4-compressed, which its variant says.

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
    InProgress { lease_for: u64 },
    Completed { completed_after: u64, ttl: u64 },
}

pub(super) fn encode_body(record: &Record, packing: Packing, out: &mut Vec<u8>) {
    let claimed_at = record.claimed_at;
    let compressed;
    let state = match &record.state {
        RecordState::InProgress { lease_until } => StateRef::InProgress {
            lease_for: lease_until.wrapping_sub(claimed_at),
        },
        RecordState::Completed {
            completed_at,
            expires_at,
            response,
        } => {
            compressed = match packing {
                Packing::Plain => None,
                Packing::Lz4 => Some(compress(response)),
            };
            StateRef::Completed {
                completed_after: completed_at.wrapping_sub(claimed_at),
                ttl: expires_at.wrapping_sub(*completed_at),
                response: match &compressed {
                    Some(Compressed::Lz4 { length, packed }) => ResponseRef::Lz4 {
                        length: *length,
                        packed,
                    },
                    Some(Compressed::No(encoded)) => ResponseRef::Plain(Fields::Encoded(encoded)),
                    None => ResponseRef::Plain(Fields::Response(response)),
                },
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

pub(super) fn decode(body: &[u8]) -> Result<Record, DecodeFailure> {
    let body: Body = decode_all(body, CONFIG)?;
    let claimed_at = u64::from_le_bytes(body.claimed_at);
    let state = match body.state {
        State::InProgress { lease_for } => RecordState::InProgress {
            lease_until: claimed_at.wrapping_add(lease_for),
        },
        State::Completed {
            completed_after,
            ttl,
            response,
        } => {
            let completed_at = claimed_at.wrapping_add(completed_after);
            RecordState::Completed {
                completed_at,
                expires_at: completed_at.wrapping_add(ttl),
                response: match response {
                    Packed::Plain(response) => response,
                    Packed::Lz4 { length, packed } => decompress(length, &packed)?,
                },
            }
        }
    };
    Ok(Record {
        fence: body.fence,
        fingerprint: body.fingerprint,
        claimed_at,
        state,
    })
}

pub(super) fn decode_head(body: &[u8]) -> Result<Head, DecodeFailure> {
    let head: BodyHead = decode_front(body, CONFIG)?;
    let claimed_at = u64::from_le_bytes(head.claimed_at);
    let state = match head.state {
        StateHead::InProgress { lease_for } => HeadState::InProgress {
            lease_until: claimed_at.wrapping_add(lease_for),
        },
        StateHead::Completed {
            completed_after,
            ttl,
        } => {
            let completed_at = claimed_at.wrapping_add(completed_after);
            HeadState::Completed {
                completed_at,
                expires_at: completed_at.wrapping_add(ttl),
            }
        }
    };
    Ok(Head {
        fence: head.fence,
        fingerprint: head.fingerprint,
        claimed_at,
        state,
    })
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
            let mut value = frame_start(FORMAT, b"k");
            bincode::encode_into_std_write(body, &mut value, CONFIG).unwrap();
            let value = frame_end(value);
            match Record::decode(&value) {
                Err(DecodeFailure::Body(why)) => assert!(why.contains(says), "{length}: {why}"),
                other => panic!("{length}: {other:?}"),
            }
        }
    }
}
