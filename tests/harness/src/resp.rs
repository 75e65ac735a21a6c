//! A minimal blocking RESP2 client for inspecting and steering individual nodes (cluster
//! bookkeeping, `INFO`, `SENTINEL ...`) from synchronous harness code, where a fred client
//! would need a runtime. It talks to the real server; nothing is mocked.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as text: status, error, integer or (lossy) bulk string; empty otherwise.
    pub fn text(&self) -> String {
        match self {
            Reply::Status(s) | Reply::Error(s) => s.clone(),
            Reply::Int(n) => n.to_string(),
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Nil | Reply::Array(_) => String::new(),
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The elements of an array reply (empty for anything else).
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(items) => items,
            _ => &[],
        }
    }
}

/// A blocking connection to one server on 127.0.0.1.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    /// Connects with a 1 s connect timeout and a 10 s read/write timeout.
    pub fn connect(port: u16) -> io::Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one command; a Redis error comes back as `Ok(Reply::Error(..))`.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        let mut buf = Vec::new();
        encode(&mut buf, args);
        self.writer.write_all(&buf)?;
        read_reply(&mut self.reader)
    }
}

/// Appends the command `args` to `out` as a RESP array of bulk strings, the form Redis reads.
pub fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads one reply from `reader`: for a reader of its own beside a writer that does not wait
/// (a pipeline), as [`Conn::call`] reads the one it waits for.
pub fn read_reply<R: BufRead>(reader: &mut R) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad RESP line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    match kind {
        "+" => Ok(Reply::Status(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => rest.parse().map(Reply::Int).map_err(|_| bad()),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                return Ok(Reply::Nil);
            }
            let mut data = vec![0; len as usize + 2];
            reader.read_exact(&mut data)?;
            data.truncate(len as usize);
            Ok(Reply::Bulk(data))
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                return Ok(Reply::Nil);
            }
            (0..len)
                .map(|_| read_reply(reader))
                .collect::<io::Result<_>>()
                .map(Reply::Array)
        }
        _ => Err(bad()),
    }
}

/// One command on a fresh connection to `127.0.0.1:port`. Redis errors become `Err` too.
pub fn call<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Result<Reply, String> {
    let mut conn = Conn::connect(port).map_err(|e| format!("connect to {port}: {e}"))?;
    match conn.call(args) {
        Ok(Reply::Error(e)) => Err(e),
        Ok(reply) => Ok(reply),
        Err(e) => Err(format!("{port}: {e}")),
    }
}

/// `call` returning the reply as text (see [`Reply::text`]).
pub fn call_text<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Result<String, String> {
    call(port, args).map(|r| r.text())
}
