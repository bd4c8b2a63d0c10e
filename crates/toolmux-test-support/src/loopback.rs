//! An axum router served on `127.0.0.1` at a free port, on a thread of its own with its
//! own runtime, so that tests of any runtime flavour (or none) can reach it; it stops when
//! its [`Loopback`] is dropped.

use axum::Router;
use std::future::IntoFuture;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

/// A running server; dropping it stops it.
#[derive(Debug)]
pub struct Loopback {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Loopback {
    /// Serves `app` on a free loopback port, on a thread named `name-PORT`.
    pub fn serve(name: &str, app: Router) -> Loopback {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a test machine can bind a loopback port");
        listener.set_nonblocking(true).expect("a bound socket can be made non-blocking");
        let addr = listener.local_addr().expect("a bound socket has an address");
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name(format!("{name}-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a test machine can start a tokio runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("a non-blocking listener registers with tokio");
                    // Requests still open (a delayed answer) end with the runtime.
                    tokio::select! {
                        _ = axum::serve(listener, app).into_future() => {}
                        () = stopped.cancelled() => {}
                    }
                });
            })
            .expect("a test machine can start a thread");
        Loopback { addr, stop }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
