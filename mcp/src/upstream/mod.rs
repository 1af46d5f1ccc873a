//! Upstream servers: where the gateway forwards what the client asks. One child process
//! (`child`), or several upstreams of a config (children and Streamable HTTP URLs, `http`)
//! joined into one link by the `hub`.

pub(crate) mod child;
pub(crate) mod http;
pub(crate) mod hub;
