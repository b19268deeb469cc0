//! A TCP proxy on loopback in front of the API server. [`Proxy::cut`] simulates a network
//! partition: open connections are dropped and new ones are accepted but never answered, so
//! requests hang (the hard case: no quick "connection refused").

use anyhow::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    /// Cancelled on cut (drops every live connection) and replaced for later connections.
    conns: Arc<std::sync::Mutex<CancellationToken>>,
    stop: CancellationToken,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let stop = CancellationToken::new();
        let (c, k, s) = (Arc::clone(&cut), Arc::clone(&conns), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = s.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let token = k.lock().expect("proxy lock").clone();
                let cut = Arc::clone(&c);
                tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        // Blackhole: hold the connection open, answer nothing.
                        token.cancelled().await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream_port)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Ok(Proxy {
            port,
            cut,
            conns,
            stop,
        })
    }

    /// Drops every open connection and blackholes new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let mut g = self.conns.lock().expect("proxy lock");
        g.cancel();
        *g = CancellationToken::new();
    }

    /// Lets traffic through again; connections accepted while cut are dropped, so that their
    /// clients reconnect instead of waiting on them forever.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
        let mut g = self.conns.lock().expect("proxy lock");
        g.cancel();
        *g = CancellationToken::new();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.conns.lock().expect("proxy lock").cancel();
    }
}
