//! Redis over the hand-written RESP2 client, one TCP connection (`TCP_NODELAY`) per caller.
//! The server must run with `appendonly yes` and `appendfsync always`: it fsyncs the AOF
//! before it answers a write. Opening the system checks both settings.

use super::resp::{self, Reply};
use super::{fail, Client, Result, Setup, System};
use crate::workload::{Payload, Request, TTL_MS};
use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// SETs written before their replies are read, in the preload.
const PIPELINE: u64 = 10_000;
/// How long to wait for an AOF rewrite.
const REWRITE_TIMEOUT: Duration = Duration::from_secs(1800);

/// One connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone()?),
            writer: BufWriter::with_capacity(64 * 1024, stream),
            buf: Vec::with_capacity(1024),
        })
    }

    fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        match resp::call(&mut self.writer, &mut self.reader, &mut self.buf, args)? {
            Reply::Error(e) => fail(format!("redis: {e}")),
            reply => Ok(reply),
        }
    }

    /// `CONFIG GET name`: the value.
    fn config(&mut self, name: &str) -> Result<String> {
        match self.call(&[b"CONFIG", b"GET", name.as_bytes()])? {
            Reply::Array(Some(items)) if items.len() == 2 => match &items[1] {
                Reply::Bulk(Some(v)) => Ok(String::from_utf8_lossy(v).into_owned()),
                other => fail(format!("redis: CONFIG GET {name}: {other:?}")),
            },
            other => fail(format!("redis: CONFIG GET {name}: {other:?}")),
        }
    }

    /// The value of one `INFO persistence` field.
    fn persistence(&mut self, field: &str) -> Result<String> {
        let Reply::Bulk(Some(info)) = self.call(&[b"INFO", b"persistence"])? else {
            return fail("redis: INFO returned no text");
        };
        let info = String::from_utf8_lossy(&info).into_owned();
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(str::to_owned)
            .ok_or_else(|| format!("redis: INFO persistence has no {field}").into())
    }

    /// Whether an AOF rewrite is running or scheduled.
    fn rewriting(&mut self) -> Result<bool> {
        Ok(self.persistence("aof_rewrite_in_progress")? != "0"
            || self.persistence("aof_rewrite_scheduled")? != "0")
    }

    /// Waits until no AOF rewrite is running or scheduled.
    fn await_rewrite(&mut self, deadline: Instant) -> Result<()> {
        while self.rewriting()? {
            if Instant::now() > deadline {
                return fail("redis: AOF rewrite did not finish");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Rewrites the AOF (dropping what the preload or a flush left) and waits for the end. A
    /// rewrite Redis started by itself (the AOF doubled during the cells) is waited for first.
    fn rewrite_aof(&mut self) -> Result<()> {
        let deadline = Instant::now() + REWRITE_TIMEOUT;
        self.await_rewrite(deadline)?;
        self.call(&[b"BGREWRITEAOF"])?;
        self.await_rewrite(deadline)
    }
}

/// The server's version, if it answers.
pub fn probe(addr: &str) -> Result<String> {
    let mut conn = Conn::open(addr)?;
    let Reply::Bulk(Some(info)) = conn.call(&[b"INFO", b"server"])? else {
        return fail("redis: INFO returned no text");
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?");
    Ok(format!("redis {version}"))
}

pub struct RedisSystem {
    addr: String,
    payload: Payload,
}

impl RedisSystem {
    /// Checks the durability settings, empties the server and preloads `keys` completed
    /// records with pipelined SETs, then rewrites the AOF (which fsyncs it) so no rewrite is
    /// pending when the cells run.
    pub fn open(setup: &Setup, keys: u64) -> Result<RedisSystem> {
        let Some(addr) = setup.redis.clone() else {
            return fail("redis: no --redis given");
        };
        let mut conn = Conn::open(&addr)?;
        let (aof, fsync) = (conn.config("appendonly")?, conn.config("appendfsync")?);
        if aof != "yes" || fsync != "always" {
            return fail(format!(
                "redis: the server runs with appendonly {aof}, appendfsync {fsync}; \
                 start it with --appendonly yes --appendfsync always"
            ));
        }
        conn.call(&[b"FLUSHALL", b"SYNC"])?;
        // The bulk path: no fsync per event-loop pass while loading (with `always`, Redis
        // fsyncs once per ~16 KiB read from a pipelining client, some 14k SETs/s here), then one
        // AOF rewrite makes the whole data set durable, then back to `always` for the cells.
        conn.call(&[b"CONFIG", b"SET", b"appendfsync", b"no"])?;
        let loaded = preload(&mut conn, setup, keys);
        let restored = conn.call(&[b"CONFIG", b"SET", b"appendfsync", b"always"]);
        loaded?;
        restored?;
        if conn.config("appendfsync")? != "always" {
            return fail("redis: appendfsync is not back to always after the preload");
        }
        conn.rewrite_aof()?;
        Ok(RedisSystem {
            addr,
            payload: setup.payload.clone(),
        })
    }
}

impl RedisSystem {
    /// The server another process checked and preloaded (a multi-process cell's parent):
    /// nothing is flushed or loaded.
    pub fn attach(setup: &Setup) -> Result<RedisSystem> {
        let Some(addr) = setup.redis.clone() else {
            return fail("redis: no --redis given");
        };
        Ok(RedisSystem {
            addr,
            payload: setup.payload.clone(),
        })
    }
}

/// Pipelined `SET key value NX PX ttl` of `keys` completed records, 10k per round trip.
fn preload(conn: &mut Conn, setup: &Setup, keys: u64) -> Result<()> {
    let ttl = TTL_MS.to_string();
    let mut requests = setup.preload_requests();
    let mut done = 0;
    let started = Instant::now();
    while done < keys {
        let batch = PIPELINE.min(keys - done);
        conn.buf.clear();
        for i in 0..batch {
            let req = requests.next_request();
            let value = setup.payload.completed_value(&req, done + i);
            resp::encode(
                &mut conn.buf,
                &[
                    b"SET",
                    req.flat_key().as_bytes(),
                    &value,
                    b"NX",
                    b"PX",
                    ttl.as_bytes(),
                ],
            );
        }
        conn.writer.write_all(&conn.buf)?;
        conn.writer.flush()?;
        for _ in 0..batch {
            match resp::read(&mut conn.reader)? {
                Reply::Simple(ok) if ok == "OK" => {}
                other => return fail(format!("redis preload: SET answered {other:?}")),
            }
        }
        done += batch;
        setup.preload_step("redis", done, keys, started)?;
    }
    Ok(())
}

impl System for RedisSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(RedisClient {
            conn: Conn::open(&self.addr)?,
            payload: &self.payload,
            ttl: TTL_MS.to_string(),
            fence: 0,
        }))
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let mut conn = Conn::open(&self.addr)?;
        conn.call(&[b"FLUSHALL", b"SYNC"])?;
        conn.rewrite_aof()
    }
}

struct RedisClient<'a> {
    conn: Conn,
    payload: &'a Payload,
    ttl: String,
    fence: u64,
}

impl Client for RedisClient<'_> {
    /// `SET key meta NX PX 86400000`: `+OK` if the key was absent.
    fn claim(&mut self, req: &Request) -> Result<()> {
        self.fence += 1;
        let meta = self.payload.meta(req, self.fence);
        let key = req.flat_key();
        match self.conn.call(&[
            b"SET",
            key.as_bytes(),
            &meta,
            b"NX",
            b"PX",
            self.ttl.as_bytes(),
        ])? {
            Reply::Simple(ok) if ok == "OK" => Ok(()),
            other => fail(format!("redis: new key {key} not claimed: {other:?}")),
        }
    }

    /// `SET key meta+response XX PX 86400000`: `+OK` if the key exists.
    fn complete(&mut self, req: &Request) -> Result<()> {
        let value = self.payload.completed_value(req, self.fence);
        let key = req.flat_key();
        match self.conn.call(&[
            b"SET",
            key.as_bytes(),
            &value,
            b"XX",
            b"PX",
            self.ttl.as_bytes(),
        ])? {
            Reply::Simple(ok) if ok == "OK" => Ok(()),
            other => fail(format!("redis: claimed key {key} not completed: {other:?}")),
        }
    }
}
