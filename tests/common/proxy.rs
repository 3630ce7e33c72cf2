//! A fault-injecting TCP proxy owned by the test (toxiproxy is not installable here).
//!
//! It runs on its own thread with its own current-thread runtime, so it keeps forwarding while
//! the test's runtime is blocked (a `std::thread::sleep`, a `psql` call, waiting on a child).
//!
//! Controls are `watch` channels. Each connection subscribes with `Sender::subscribe()`, which
//! marks the *current* cut generation as seen: a cloned `Receiver` would inherit an unseen
//! change, and after one `cut_all` every new connection would be cut at once.
//!
//! Cuts and refusals close with `SO_LINGER` 0, so peers see a reset (ECONNRESET), not an EOF.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy from 127.0.0.1:`port` to 127.0.0.1:`target`; stops on drop.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("target", &self.shared.target)
            .finish_non_exhaustive()
    }
}

struct Shared {
    target: u16,
    /// Generation counter; every bump resets the connections alive at that moment.
    cut: watch::Sender<u64>,
    stall: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    refuse: AtomicBool,
    /// Live connections: id → the cut generation current when it was accepted.
    live: Mutex<HashMap<u64, u64>>,
    next_id: AtomicU64,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards to 127.0.0.1:`target_port`.
    pub async fn start(target_port: u16) -> Proxy {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("proxy: binding 127.0.0.1:0: {e}"));
        listener
            .set_nonblocking(true)
            .expect("proxy: non-blocking listener");
        let port = listener.local_addr().expect("proxy: local addr").port();
        let shared = Arc::new(Shared {
            target: target_port,
            cut: watch::Sender::new(0),
            stall: watch::Sender::new(false),
            shutdown: watch::Sender::new(false),
            refuse: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy: building runtime");
                // Dropping the runtime afterwards drops (and closes) every connection task.
                rt.block_on(accept_loop(listener, for_thread));
            })
            .expect("proxy: spawning thread");
        Proxy {
            port,
            shared,
            thread: Some(thread),
        }
    }

    /// Resets every live connection and returns once they are closed (so the test's next
    /// request on them fails rather than racing the proxy); new connections are still accepted.
    pub fn cut_all(&self) {
        let mut current = 0;
        self.shared.cut.send_modify(|generation| {
            *generation += 1;
            current = *generation;
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.shared.lock_live().values().any(|&g| g < current) {
            assert!(
                Instant::now() < deadline,
                "proxy: cut connections did not close in 10 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// While true, new connections are reset as soon as they are accepted.
    pub fn set_refuse(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    /// While true, no bytes are forwarded in either direction and connections stay open: a
    /// silent partition. Buffered bytes flow again when it is set back to false.
    pub fn set_stall(&self, stall: bool) {
        self.shared.stall.send_replace(stall);
    }

    /// Connections currently live: accepted and not yet closed (including any still
    /// connecting to the target).
    pub fn connections(&self) -> usize {
        self.shared.lock_live().len()
    }

    /// Waits until at least `n` connections are live; false on timeout.
    pub async fn wait_for_connections(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.connections() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: std::net::TcpListener, shared: Arc<Shared>) {
    let listener = TcpListener::from_std(listener).expect("proxy: registering listener");
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.refuse.load(Ordering::SeqCst) {
            reset(client);
            continue;
        }
        // Subscribe and register at accept time: a cut from now on applies to this connection,
        // and `cut_all` waits for it.
        let cut = shared.cut.subscribe();
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        shared.lock_live().insert(id, *cut.borrow());
        let live = Live {
            shared: Arc::clone(&shared),
            id,
        };
        tokio::spawn(forward(client, cut, live));
    }
}

impl Shared {
    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Deregisters a connection however its task ends (after its sockets are closed).
struct Live {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.shared.lock_live().remove(&self.id);
    }
}

async fn forward(mut client: TcpStream, mut cut: watch::Receiver<u64>, live: Live) {
    let shared = Arc::clone(&live.shared);
    let Ok(mut upstream) = TcpStream::connect((Ipv4Addr::LOCALHOST, shared.target)).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let closed_cleanly = if cut.has_changed().unwrap_or(true) {
        false
    } else {
        let (mut client_r, mut client_w) = client.split();
        let (mut up_r, mut up_w) = upstream.split();
        tokio::select! {
            _ = cut.changed() => false,
            pumped = async {
                tokio::try_join!(
                    pump(&mut client_r, &mut up_w, shared.stall.subscribe()),
                    pump(&mut up_r, &mut client_w, shared.stall.subscribe()),
                )
            } => pumped.is_ok(),
        }
    };
    if !closed_cleanly {
        reset(client);
        reset(upstream);
    }
    drop(live);
}

/// Copies one direction until EOF (then half-closes the other side), holding bytes while
/// stalled.
async fn pump<R, W>(from: &mut R, to: &mut W, mut stall: watch::Receiver<bool>) -> io::Result<()>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        if stall.wait_for(|stalled| !*stalled).await.is_err() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// Closes with RST rather than FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}
