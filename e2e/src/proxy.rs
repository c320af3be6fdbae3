//! A TCP proxy on 127.0.0.1 that can hold back traffic: the chaos suite's "slow store".
//!
//! Every byte from a client to the upstream server passes through it; while a delay is set,
//! each chunk a client sends waits that long before it is forwarded, so every request (and
//! every part of a request body) arrives late. Responses flow back untouched. With no delay it
//! is a plain pipe, so a whole test run can point at it and slow the store down only while a
//! scenario wants it.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! let proxy = cojob_e2e::proxy::LatencyProxy::start("127.0.0.1:9000".parse().unwrap()).await?;
//! let endpoint = format!("http://{}", proxy.addr());
//! proxy.set_delay(Duration::from_secs(2)); // every request now arrives 2 s late
//! proxy.set_delay(Duration::ZERO);
//! # let _ = endpoint; Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; it stops accepting when dropped (connections already open finish).
pub struct LatencyProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<LatencyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let delay = delay.clone();
                tokio::spawn(async move {
                    // A failed upstream connect closes the client's connection: the client
                    // sees what it would see if the server were down.
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        pipe(client, server, delay).await;
                    }
                });
            }
        });
        Ok(LatencyProxy {
            addr,
            delay_ms,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every chunk a client sends for `delay` from now on (zero: no delay).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            delay.as_millis().try_into().unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways until either side closes, delaying the client-to-server direction.
async fn pipe(client: TcpStream, server: TcpStream, delay_ms: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let delay = delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: bytes pass unchanged, and late while a delay is set.
    #[tokio::test]
    async fn forwards_and_delays() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = LatencyProxy::start(upstream).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut got = [0u8; 5];
        c.write_all(b"hello").await.unwrap();
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");

        proxy.set_delay(Duration::from_millis(300));
        let sent = std::time::Instant::now();
        c.write_all(b"again").await.unwrap();
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"again");
        assert!(
            sent.elapsed() >= Duration::from_millis(300),
            "the delay was not applied: {:?}",
            sent.elapsed()
        );
    }
}
