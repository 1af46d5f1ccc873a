//! The codecs of stored results: the closure's bytes as they are, or serde values as JSON
//! (feature `serde`).

#[cfg(feature = "serde")]
use crate::error::Error;
use crate::error::Result;
#[cfg(feature = "serde")]
use crate::model::fingerprint::Fingerprint;

#[cfg(doc)]
use super::IdempotentFn;

/// How results are stored: as the bytes the closure returned ([`IdempotentFn::call`]), or as
/// JSON ([`IdempotentFn::call_json`]).
pub(crate) trait Codec<V> {
    fn encode(value: &V) -> Result<Vec<u8>>;
    fn decode(bytes: Vec<u8>) -> Result<V>;
}

pub(crate) struct Raw;

impl Codec<Vec<u8>> for Raw {
    fn encode(value: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(value.clone())
    }

    fn decode(bytes: Vec<u8>) -> Result<Vec<u8>> {
        Ok(bytes)
    }
}

#[cfg(feature = "serde")]
pub(crate) struct Json;

#[cfg(feature = "serde")]
impl Json {
    pub(crate) fn fingerprint(input: &impl serde::Serialize) -> Result<Fingerprint> {
        let bytes = serde_json::to_vec(input).map_err(|e| encoding("input", e))?;
        Ok(Fingerprint::of(&bytes))
    }
}

#[cfg(feature = "serde")]
impl<V: serde::Serialize + serde::de::DeserializeOwned> Codec<V> for Json {
    fn encode(value: &V) -> Result<Vec<u8>> {
        serde_json::to_vec(value).map_err(|e| encoding("result", e))
    }

    fn decode(bytes: Vec<u8>) -> Result<V> {
        serde_json::from_slice(&bytes).map_err(|e| encoding("stored result", e))
    }
}

#[cfg(feature = "serde")]
fn encoding(what: &'static str, e: serde_json::Error) -> Error {
    Error::ResultEncoding {
        what,
        source: Box::new(e),
    }
}
