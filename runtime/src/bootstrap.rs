//! The rendezvous of a tensor-parallel group spread over several processes (one per host):
//! process 0 makes the group's NCCL unique id and hands its 128 bytes to every other process
//! over a plain TCP connection to `MASTER_ADDR:MASTER_PORT`. NCCL's own bootstrap takes over
//! from there (the id holds process 0's address for it).
//!
//! The exchange: a process connects (retrying until the deadline, since process 0 may start
//! later) and sends `MAGIC`, the protocol version and its view of the group (processes, ranks)
//! as little-endian u32s; process 0 answers with the id when both views agree, and closes the
//! connection without one when they do not, each side then naming the mismatch.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The id's size, `NCCL_UNIQUE_ID_BYTES`.
pub const ID_BYTES: usize = 128;

const MAGIC: &[u8; 8] = b"glmc-tp\0";
const VERSION: u32 = 1;
const HELLO_BYTES: usize = 8 + 3 * 4;

/// How long to wait between attempts to reach process 0.
const RETRY: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{addr}: {what}: {source}")]
    Io {
        addr: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr}: no answer from process 0 of the group within {secs} s: start it (RANK=0) with the same MASTER_ADDR and MASTER_PORT")]
    Unreachable { addr: String, secs: u64 },
    #[error("{addr}: only {joined} of the other {expected} processes connected within {secs} s: start every process with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE")]
    Missing {
        addr: String,
        joined: usize,
        expected: usize,
        secs: u64,
    },
    #[error("{addr}: {peer}: {why}")]
    Mismatch {
        addr: String,
        peer: String,
        why: String,
    },
}

/// What every process of one group must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Processes (hosts) in the group.
    pub processes: u32,
    /// Ranks (GPUs) in the group, over all processes.
    pub ranks: u32,
}

impl Group {
    fn hello(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.processes.to_le_bytes());
        b[16..20].copy_from_slice(&self.ranks.to_le_bytes());
        b
    }

    /// Why `hello` (a peer's) does not name this group, if it does not.
    fn disagreement(&self, hello: &[u8; HELLO_BYTES]) -> Option<String> {
        let word = |k: usize| u32::from_le_bytes(hello[k..k + 4].try_into().expect("4 bytes"));
        if &hello[..8] != MAGIC {
            return Some("not a glmc process of a tensor-parallel group".into());
        }
        if word(8) != VERSION {
            return Some(format!(
                "speaks rendezvous version {}, this glmc {VERSION}: run the same glmc on every host",
                word(8)
            ));
        }
        let theirs = Group {
            processes: word(12),
            ranks: word(16),
        };
        (theirs != *self).then(|| {
            format!(
                "its group is {} processes and --tp {}, this one's {} processes and --tp {}: give every process the same WORLD_SIZE and --tp",
                theirs.processes, theirs.ranks, self.processes, self.ranks
            )
        })
    }
}

fn io(addr: &str, what: &'static str) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let addr = addr.to_string();
    move |source| BootstrapError::Io { addr, what, source }
}

/// Process 0's side: listens on `addr` (`host:port`) and gives `id` to each of the other
/// `group.processes - 1` processes, within `timeout` in all.
pub fn serve(
    addr: &str,
    group: Group,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let listener = TcpListener::bind(addr).map_err(io(addr, "listening for the group"))?;
    serve_on(listener, addr, group, id, timeout)
}

/// [`serve`] on a listener already bound (a test binds port 0 and reads the port back).
pub fn serve_on(
    listener: TcpListener,
    addr: &str,
    group: Group,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let expected = group.processes.saturating_sub(1) as usize;
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(io(addr, "listening for the group"))?;
    let mut joined = 0;
    while joined < expected {
        let (mut stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(BootstrapError::Missing {
                        addr: addr.to_string(),
                        joined,
                        expected,
                        secs: timeout.as_secs(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(io(addr, "accepting a process of the group")(e)),
        };
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(timeout)))
            .map_err(io(addr, "talking to a process of the group"))?;
        let mut hello = [0u8; HELLO_BYTES];
        stream
            .read_exact(&mut hello)
            .map_err(io(addr, "reading a process's hello"))?;
        if let Some(why) = group.disagreement(&hello) {
            return Err(BootstrapError::Mismatch {
                addr: addr.to_string(),
                peer: peer.to_string(),
                why,
            });
        }
        stream
            .write_all(id)
            .map_err(io(addr, "sending the group's id"))?;
        joined += 1;
    }
    Ok(())
}

/// Every other process's side: the id process 0 serves at `addr`, waiting up to `timeout` for
/// it to listen.
pub fn fetch(
    addr: &str,
    group: Group,
    timeout: Duration,
) -> Result<[u8; ID_BYTES], BootstrapError> {
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        let attempt = addr
            .to_socket_addrs()
            .map_err(io(addr, "resolving MASTER_ADDR"))?
            .find_map(|a| TcpStream::connect_timeout(&a, RETRY).ok());
        match attempt {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                return Err(BootstrapError::Unreachable {
                    addr: addr.to_string(),
                    secs: timeout.as_secs(),
                })
            }
            None => std::thread::sleep(RETRY),
        }
    };
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io(addr, "talking to process 0"))?;
    stream
        .write_all(&group.hello())
        .map_err(io(addr, "sending this process's hello"))?;
    let mut id = [0u8; ID_BYTES];
    stream.read_exact(&mut id).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => BootstrapError::Mismatch {
            addr: addr.to_string(),
            peer: "process 0".into(),
            why: "closed the connection without the id: it runs another group (its error names the difference)".into(),
        },
        _ => io(addr, "reading the group's id")(e),
    })?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_listener() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = listener.local_addr().expect("bound").to_string();
        (listener, addr)
    }

    #[test]
    fn every_process_receives_the_id_of_process_zero() {
        let (listener, addr) = local_listener();
        let group = Group {
            processes: 3,
            ranks: 6,
        };
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let timeout = Duration::from_secs(10);
        let fetched = std::thread::scope(|s| {
            let server = {
                let addr = addr.clone();
                s.spawn(move || serve_on(listener, &addr, group, &id, timeout))
            };
            let peers: Vec<_> = (0..2)
                .map(|_| s.spawn(|| fetch(&addr, group, timeout)))
                .collect();
            let fetched: Vec<_> = peers.into_iter().map(|p| p.join().unwrap()).collect();
            server.join().unwrap().expect("process 0 served both");
            fetched
        });
        for f in fetched {
            assert_eq!(f.expect("fetched"), id);
        }
    }

    #[test]
    fn a_process_of_another_group_is_refused_on_both_sides() {
        let (listener, addr) = local_listener();
        let ours = Group {
            processes: 2,
            ranks: 2,
        };
        let theirs = Group {
            processes: 2,
            ranks: 4,
        };
        let timeout = Duration::from_secs(10);
        let (served, fetched) = std::thread::scope(|s| {
            let server = {
                let addr = addr.clone();
                s.spawn(move || serve_on(listener, &addr, ours, &[1; ID_BYTES], timeout))
            };
            let fetched = fetch(&addr, theirs, timeout);
            (server.join().unwrap(), fetched)
        });
        let served = served.unwrap_err().to_string();
        assert!(
            served.contains("--tp 4")
                && served.contains("--tp 2")
                && served.contains("same WORLD_SIZE"),
            "{served}"
        );
        let fetched = fetched.unwrap_err().to_string();
        assert!(fetched.contains("without the id"), "{fetched}");
    }

    #[test]
    fn process_zero_names_the_processes_that_never_came() {
        let (listener, addr) = local_listener();
        let group = Group {
            processes: 3,
            ranks: 3,
        };
        let timeout = Duration::from_millis(300);
        let err = serve_on(listener, &addr, group, &[0; ID_BYTES], timeout).unwrap_err();
        assert!(
            err.to_string().contains("only 0 of the other 2 processes"),
            "{err}"
        );
    }

    #[test]
    fn a_process_without_process_zero_gives_up_at_the_deadline() {
        // Bound and dropped: nothing listens there any more.
        let addr = local_listener().1;
        let group = Group {
            processes: 2,
            ranks: 2,
        };
        let start = Instant::now();
        let err = fetch(&addr, group, Duration::from_millis(500)).unwrap_err();
        assert!(
            err.to_string().contains("no answer from process 0"),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
