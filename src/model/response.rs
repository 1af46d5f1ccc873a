//! The stored response a replay returns byte for byte.

/// The highest value `max_response_bytes` may be set to.
pub const MAX_RESPONSE_LIMIT: usize = 64 << 20;

/// A response to store on completion and return on every replay: a status, headers in their
/// original order (repeated names kept), and a body.
///
/// ```
/// let r = idemdb::Response::new(201, r#"{"id":"pay_1"}"#)
///     .with_header("content-type", "application/json")
///     .with_header("set-cookie", "a=1")
///     .with_header("set-cookie", "b=2");
/// assert_eq!(r.status(), 201);
/// assert_eq!(r.headers()[2], ("set-cookie".to_string(), b"b=2".to_vec()));
/// assert_eq!(r.body(), br#"{"id":"pay_1"}"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// A response with `status` and `body` and no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Appends a header. Names and values are stored as given (no case folding, no merging), so
    /// a replay returns exactly what the first attempt did.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers, in the order they were added.
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The response's size as [`crate::StoreBuilder::max_response_bytes`] counts it, on every
    /// engine: the bytes it takes in a store file's record (status 2, header count 8, per
    /// header two 8-byte lengths with the name and the value, body length 8 with the body).
    pub(crate) fn encoded_size(&self) -> usize {
        18 + self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| 16 + n.len() + v.len())
                .sum::<usize>()
    }

    /// Takes the body out without copying it.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}
