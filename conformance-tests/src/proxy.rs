//! [`Proxy`]: a TCP relay on loopback between a backend and its server, which a case
//! can [`cut`](Proxy::cut) at any moment, for SPEC X3: the connections it carries drop
//! mid-operation, as when a server, a load balancer or the network fails.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// A relay from a loopback port to a server; dropped, it stops listening and drops
/// every connection it carries.
pub struct Proxy {
    addr: SocketAddr,
    cuts: watch::Sender<u64>,
    carried: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts relaying connections made to [`addr`](Self::addr) to `server`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(server: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cuts, _) = watch::channel(0u64);
        let carried = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn(accept(listener, server, cuts.clone(), carried.clone()));
        Ok(Self {
            addr,
            cuts,
            carried,
            accept,
        })
    }

    /// Where clients connect.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection open now, both ways, without a word to either side;
    /// connections made afterwards are relayed again.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// How many connections it has relayed so far.
    #[must_use]
    pub fn connections(&self) -> u64 {
        self.carried.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept(
    listener: TcpListener,
    server: SocketAddr,
    cuts: watch::Sender<u64>,
    carried: Arc<AtomicU64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        carried.fetch_add(1, Ordering::Relaxed);
        let mut cut = cuts.subscribe();
        cut.mark_unchanged();
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(server).await else {
                return;
            };
            let (mut client, mut upstream) = (client, upstream);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = cut.changed() => {}
            }
            // Both sockets drop here: each side sees its connection end mid-call.
        });
    }
}
