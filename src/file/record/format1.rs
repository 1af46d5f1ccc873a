//! Record format 1, which stores before format 6 wrote: the body is bincode 2 with fixed-width
//! little-endian integers, [`Record`]'s fields as they are. Read only; records of this format
//! stay in a store until their key is written again or purged.

use super::{decode_all, decode_front, DecodeFailure, Head, Record, DECODE_LIMIT};

pub(super) const FORMAT: u8 = 1;

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Fixint,
    bincode::config::Limit<DECODE_LIMIT>,
>;

const CONFIG: Config = bincode::config::standard()
    .with_little_endian()
    .with_fixed_int_encoding()
    .with_limit::<DECODE_LIMIT>();

pub(super) fn decode(body: &[u8]) -> Result<Record, DecodeFailure> {
    decode_all(body, CONFIG)
}

/// The body's front as a [`Head`]: its fields are laid out exactly as [`Record`]'s first ones.
pub(super) fn decode_head(body: &[u8]) -> Result<Head, DecodeFailure> {
    decode_front(body, CONFIG)
}

/// A whole value of format 1, as a store before format 6 wrote it: for tests of what this
/// build reads.
#[cfg(test)]
pub(crate) fn encode(record: &Record, scoped_key: &[u8]) -> Vec<u8> {
    let mut out = super::frame_start(FORMAT, scoped_key, 0);
    bincode::encode_into_std_write(record, &mut out, CONFIG)
        .expect("encoding into a Vec cannot fail");
    super::frame_end(out)
}

/// Pins format 1 byte for byte (`docs/format.md` walks through these bytes): stores hold
/// records of it, so these bytes must always decode to these records.
#[cfg(test)]
mod golden {
    use super::super::worked::{self, hex, KEY};
    use super::*;

    #[test]
    fn in_progress_record_bytes() {
        let r = worked::in_progress();
        let expect = concat!(
            "01",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "0201000000000000",                                                 // fence
            "1111111111111111111111111111111111111111111111111111111111111111", // fingerprint
            "00a8da769b010000",                                                 // claimed_at
            "00000000",                                                         // InProgress
            "6092db769b010000",                                                 // lease_until
        );
        let bytes = encode(&r, KEY);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(hex(body), expect);
        assert_eq!(hex(crc), "5a208f35");
        assert_eq!(Record::decode(&bytes).unwrap(), (KEY, r));
    }

    #[test]
    fn completed_record_bytes() {
        let r = worked::completed();
        let expect = concat!(
            "01",                                                               // format
            "0600",                                                             // key length
            "01740001656b",                                                     // scoped key
            "0700000000000000",                                                 // fence
            "2222222222222222222222222222222222222222222222222222222222222222", // fingerprint
            "0100000000000000",                                                 // claimed_at
            "01000000",                                                         // Completed
            "0200000000000000",                                                 // completed_at
            "0300000000000000",                                                 // expires_at
            "c900",                                                             // status 201
            "0100000000000000",                                                 // 1 header
            "0100000000000000",                                                 // name len
            "61",                                                               // "a"
            "0200000000000000",                                                 // value len
            "6263",                                                             // "bc"
            "0200000000000000",                                                 // body len
            "6f6b",                                                             // "ok"
        );
        let bytes = encode(&r, KEY);
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        assert_eq!(hex(body), expect);
        assert_eq!(hex(crc), "f6340973");
        assert_eq!(Record::decode(&bytes).unwrap(), (KEY, r));
    }
}
