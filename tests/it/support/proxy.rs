//! A fault-injecting TCP proxy between the process under test and a real redis-server.
//!
//! [`Proxy::start`] listens on a free 127.0.0.1 port and forwards every accepted connection
//! to the upstream port; point the daemon's (or a store's) Redis URL at [`Proxy::url`] and
//! the test decides what the network does:
//!
//! * [`Proxy::cut_after`]: the next `times` client connections that send `pattern` (raw bytes,
//!   e.g. `b"EXEC"`) have the chunk holding it forwarded to the server, then lose their
//!   client side before any byte of the server's reply goes back: the server executed the
//!   command, the client never hears of it. [`Proxy::cuts`] counts the cuts made.
//! * [`Proxy::cut_at`]: as `cut_after`, but the cut waits for the `nth` occurrence of the
//!   pattern (counted over every connection from the moment it is armed), e.g. the fifth
//!   expiry call of a roll or the third apply call of a batch.
//! * [`Proxy::latency`]: every chunk read from either side waits that long before it is
//!   forwarded, like a slow network.
//! * [`Proxy::blackhole`]: while on, connections are accepted but nothing is forwarded in
//!   either direction (bytes wait in the kernel buffers; new connections are not connected
//!   upstream), like a network partition; turning it off resumes forwarding.
//! * [`Proxy::close_all`]: drops every open connection at once, as a restarted server would.
//! * [`Proxy::hold_at`]: the chunk holding the `nth` occurrence of a pattern waits, unsent,
//!   until the test releases it: the test runs other clients' commands between two calls
//!   of the process under test (e.g. between two HSCAN pages of one scan), deterministically.
//!
//! Each connection is one task that forwards both directions in a `select!` loop, so a cut
//! can never race a reply through. The server side of a cut connection is half-closed and
//! drained to its end rather than reset, so the server always executes what it was sent.
//! I/O errors end the connection they happened on and nothing else; dropping the proxy
//! stops every task.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// An armed cut: the pattern to look for and how many connections are still to be cut.
pub struct Cut {
    pattern: Vec<u8>,
    remaining: usize,
    /// Occurrences still to be let through before the first cut.
    skip: usize,
}

/// What the test controls, shared with every connection task.
pub struct Shared {
    /// `true` while blackholed.
    blackhole: watch::Sender<bool>,
    /// Replaced by [`Proxy::close_all`]; a connection ends when the token it started with fires.
    close: Mutex<CancellationToken>,
    /// The armed cut, if any.
    cut: Mutex<Option<Cut>>,
    /// Cuts made so far.
    cuts: AtomicUsize,
    /// Added to every forwarded chunk, in milliseconds.
    latency_ms: AtomicU64,
    /// The armed hold, if any.
    hold: Mutex<Option<ArmedHold>>,
    upstream: u16,
}

/// An armed hold: the pattern, occurrences still to let through, and the test's handle.
pub struct ArmedHold {
    pattern: Vec<u8>,
    skip: usize,
    hold: Arc<Hold>,
}

/// The test's side of [`Proxy::hold_at`].
#[derive(Default)]
pub struct Hold {
    reached: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Hold {
    /// Waits until the held chunk has arrived (it is not sent yet).
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Sends the held chunk on.
    pub fn release(&self) {
        // `notify_one` keeps a permit when the connection is not waiting yet.
        self.release.notify_one();
    }
}

impl Shared {
    /// Whether `window` (the bytes just read from a client, with the tail of the previous
    /// read in front) holds the armed pattern; if so, uses up one cut.
    fn take_cut(&self, window: &[u8]) -> bool {
        let mut armed = self.cut.lock().expect("cut lock");
        let hit = armed.as_mut().is_some_and(|c| {
            if c.remaining == 0 {
                return false;
            }
            // The window keeps fewer bytes of the previous read than the pattern has, so
            // every occurrence counted here ends in the new bytes and is counted once.
            let seen = window
                .windows(c.pattern.len())
                .filter(|w| *w == c.pattern)
                .count();
            if seen > c.skip {
                c.skip = 0;
                true
            } else {
                c.skip -= seen;
                false
            }
        });
        if hit {
            if let Some(c) = armed.as_mut() {
                c.remaining -= 1;
                if c.remaining == 0 {
                    *armed = None;
                }
            }
            self.cuts.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }

    /// As [`Shared::take_cut`], for the armed hold: the hold to wait on when `window` (with
    /// fewer bytes of the previous read in front than the hold's pattern has) reaches its
    /// occurrence; the hold is then disarmed.
    fn take_hold(&self, window: &[u8]) -> Option<Arc<Hold>> {
        let mut armed = self.hold.lock().expect("hold lock");
        let h = armed.as_mut()?;
        let seen = window
            .windows(h.pattern.len())
            .filter(|w| *w == h.pattern)
            .count();
        if seen > h.skip {
            armed.take().map(|h| h.hold)
        } else {
            h.skip -= seen;
            None
        }
    }

    fn hold_pattern_len(&self) -> usize {
        let hold = self.hold.lock().expect("hold lock");
        hold.as_ref().map_or(0, |h| h.pattern.len())
    }

    fn pattern_len(&self) -> usize {
        let cut = self.cut.lock().expect("cut lock");
        cut.as_ref().map_or(0, |c| c.pattern.len())
    }
}

/// A running proxy; dropping it stops the listener and every connection.
pub struct Proxy {
    /// The loopback port it listens on.
    pub port: u16,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on a free loopback port");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            blackhole: watch::Sender::new(false),
            close: Mutex::new(CancellationToken::new()),
            cut: Mutex::new(None),
            cuts: AtomicUsize::new(0),
            latency_ms: AtomicU64::new(0),
            hold: Mutex::new(None),
            upstream,
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), stop.clone()));
        Proxy { port, shared, stop }
    }

    /// A store (prefix `rb`, one call in flight, reconnecting) reaching Redis through the
    /// proxy.
    pub async fn store(&self) -> rollboard::store::Store {
        use rollboard::store::{Reconnect, Store};
        Store::connect(&self.url(), "rb", 1, Reconnect::Forever)
            .await
            .expect("connect")
            .with_script_calls(crate::support::env::script_calls())
    }

    /// The Redis URL that goes through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Arms a cut for the next `times` client connections that send `pattern` (replacing any
    /// cut still armed): the chunk holding it reaches the server, the reply never reaches the
    /// client, whose connection is dropped.
    pub fn cut_after(&self, pattern: &[u8], times: usize) {
        assert!(!pattern.is_empty(), "an empty pattern would cut everything");
        self.cut_at(pattern, 1, times);
    }

    /// Arms a cut at the `nth` occurrence (1-based) of `pattern` from now on, over every
    /// connection, and at the first occurrence on each of the `times - 1` connections after
    /// it (replacing any cut still armed).
    pub fn cut_at(&self, pattern: &[u8], nth: usize, times: usize) {
        assert!(!pattern.is_empty(), "an empty pattern would cut everything");
        assert!(nth >= 1, "occurrences count from 1");
        *self.shared.cut.lock().expect("cut lock") = (times > 0).then(|| Cut {
            pattern: pattern.to_vec(),
            remaining: times,
            skip: nth - 1,
        });
    }

    /// Whether a cut is still armed.
    pub fn armed(&self) -> bool {
        self.shared.cut.lock().expect("cut lock").is_some()
    }

    /// Delays every chunk forwarded in either direction by `delay` (zero turns it off).
    pub fn latency(&self, delay: Duration) {
        self.shared
            .latency_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// How many connections were cut so far.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// Arms a hold at the `nth` occurrence (1-based) of `pattern` from now on, over every
    /// connection (replacing any hold still armed): the chunk holding it waits until
    /// [`Hold::release`] (so do replies on that connection: the test runs its commands on
    /// another one).
    pub fn hold_at(&self, pattern: &[u8], nth: usize) -> Arc<Hold> {
        assert!(
            !pattern.is_empty(),
            "an empty pattern would hold everything"
        );
        assert!(nth >= 1, "occurrences count from 1");
        let hold = Arc::new(Hold::default());
        *self.shared.hold.lock().expect("hold lock") = Some(ArmedHold {
            pattern: pattern.to_vec(),
            skip: nth - 1,
            hold: hold.clone(),
        });
        hold
    }

    /// Stops (`true`) or resumes (`false`) forwarding, for open and new connections.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Drops every open connection; later connections are served as usual.
    pub fn close_all(&self) {
        let old = std::mem::replace(
            &mut *self.shared.close.lock().expect("close lock"),
            CancellationToken::new(),
        );
        old.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                // E.g. out of file descriptors: the client sees a refused connection.
                Err(_) => continue,
            },
        };
        let closed = shared.close.lock().expect("close lock").clone();
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = closed.cancelled() => {}
                _ = serve(client, &shared) => {}
            }
        });
    }
}

/// Waits until the blackhole is off (at once when it is).
async fn open(blackhole: &mut watch::Receiver<bool>) {
    // An error means the proxy is gone; the connection ends with it anyway.
    let _ = blackhole.wait_for(|on| !*on).await;
}

/// Waits until the blackhole is on (at once when it is); cancel safe.
async fn shut(blackhole: &mut watch::Receiver<bool>) {
    let _ = blackhole.wait_for(|on| *on).await;
}

/// Forwards one connection until either side closes, an I/O error, or a cut.
async fn serve(mut client: TcpStream, shared: &Shared) {
    let mut blackhole = shared.blackhole.subscribe();
    open(&mut blackhole).await;
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", shared.upstream)).await else {
        return;
    };
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    // The last bytes sent upstream, so that a pattern split over two reads is still seen
    // (one tail per pattern: each keeps fewer bytes than its pattern has).
    let mut tail: Vec<u8> = Vec::new();
    let mut hold_tail: Vec<u8> = Vec::new();
    let delay = || async {
        let ms = shared.latency_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    };
    loop {
        open(&mut blackhole).await;
        tokio::select! {
            // Turned on while waiting for bytes: go back and wait for it to be turned off.
            _ = shut(&mut blackhole) => {}
            read = client.read(&mut up) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                tail.extend_from_slice(&up[..n]);
                hold_tail.extend_from_slice(&up[..n]);
                let cut = shared.take_cut(&tail);
                if let Some(hold) = shared.take_hold(&hold_tail) {
                    hold.reached.notify_one();
                    hold.release.notified().await;
                }
                let keep = shared.hold_pattern_len().saturating_sub(1);
                let drop_front = hold_tail.len().saturating_sub(keep);
                hold_tail.drain(..drop_front);
                delay().await;
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
                if cut {
                    drop(client);
                    // Half-close and read to the end instead of resetting the connection:
                    // the server then runs every command it received.
                    let _ = server.shutdown().await;
                    while matches!(server.read(&mut down).await, Ok(n) if n > 0) {}
                    return;
                }
                let keep = shared.pattern_len().saturating_sub(1);
                let drop_front = tail.len().saturating_sub(keep);
                tail.drain(..drop_front);
            }
            read = server.read(&mut down) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                delay().await;
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
