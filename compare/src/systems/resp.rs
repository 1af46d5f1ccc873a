//! A minimal RESP2 client: commands as arrays of bulk strings, replies parsed from a buffered
//! stream. Enough for `SET`, `FLUSHALL`, `CONFIG GET`, `INFO` and pipelining.

use std::io::{self, BufRead, Write};

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$n` then n bytes; `None` for the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*n` then n replies; `None` for the null array `*-1`.
    Array(Option<Vec<Reply>>),
}

/// Appends `args` to `out` as one RESP command.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Reads one line without its `\r\n`.
fn line(input: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    input.read_until(b'\n', &mut buf)?;
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    if !buf.ends_with(b"\r\n") {
        return Err(invalid(format!(
            "RESP line not ended by CRLF: {:?}",
            String::from_utf8_lossy(&buf)
        )));
    }
    buf.truncate(buf.len() - 2);
    Ok(buf)
}

fn number(bytes: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            invalid(format!(
                "bad RESP number {:?}",
                String::from_utf8_lossy(bytes)
            ))
        })
}

/// Reads one reply.
pub fn read(input: &mut impl BufRead) -> io::Result<Reply> {
    let head = line(input)?;
    let Some((&kind, rest)) = head.split_first() else {
        return Err(invalid("empty RESP line".into()));
    };
    let text = || String::from_utf8_lossy(rest).into_owned();
    Ok(match kind {
        b'+' => Reply::Simple(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Integer(number(rest)?),
        b'$' => {
            let len = number(rest)?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let mut data = vec![0; len as usize + 2];
                input.read_exact(&mut data)?;
                if !data.ends_with(b"\r\n") {
                    return Err(invalid("bulk string not ended by CRLF".into()));
                }
                data.truncate(len as usize);
                Reply::Bulk(Some(data))
            }
        }
        b'*' => {
            let len = number(rest)?;
            if len < 0 {
                Reply::Array(None)
            } else {
                let items = (0..len).map(|_| read(input)).collect::<io::Result<_>>()?;
                Reply::Array(Some(items))
            }
        }
        other => {
            return Err(invalid(format!(
                "unknown RESP type byte {:?}",
                char::from(other)
            )))
        }
    })
}

/// Sends one command and reads its reply.
pub fn call(
    writer: &mut impl Write,
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    args: &[&[u8]],
) -> io::Result<Reply> {
    buf.clear();
    encode(buf, args);
    writer.write_all(buf)?;
    writer.flush()?;
    read(reader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read(&mut &bytes[..])
    }

    #[test]
    fn encodes_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"v v"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv v\r\n");
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            parse(b"-ERR nope\r\n").unwrap(),
            Reply::Error("ERR nope".into())
        );
        assert_eq!(parse(b":-12\r\n").unwrap(), Reply::Integer(-12));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            parse(b"$4\r\na\r\nb\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nb".to_vec()))
        );
        assert_eq!(
            parse(b"*2\r\n$3\r\nfoo\r\n:1\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"foo".to_vec())),
                Reply::Integer(1)
            ]))
        );
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
    }

    #[test]
    fn parses_pipelined_replies_in_order() {
        let mut input = &b"+OK\r\n$-1\r\n:3\r\n"[..];
        assert_eq!(read(&mut input).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(read(&mut input).unwrap(), Reply::Bulk(None));
        assert_eq!(read(&mut input).unwrap(), Reply::Integer(3));
    }

    #[test]
    fn rejects_malformed_input() {
        assert!(parse(b"+OK\n").is_err());
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b":abc\r\n").is_err());
        assert!(parse(b"$5\r\nab\r\n").is_err());
        assert_eq!(parse(b"").unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
