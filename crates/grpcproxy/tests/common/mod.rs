//! What the in-process proxy tests share: our proxy run in this process (so a test can use
//! what stock clients cannot send) in front of a real member.

use etcdrs_grpcproxy::{Listeners, ProxyConfig, run};
use etcdrs_testkit::Member;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A running in-process proxy.
pub struct InProcessProxy {
    /// Its listener's address (not every test binary reads it).
    #[allow(dead_code)]
    pub addr: std::net::SocketAddr,
    /// A channel to it.
    pub channel: Channel,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), etcdrs_grpcproxy::Error>>,
}

impl InProcessProxy {
    /// Our proxy with `namespace` in front of `member`, with a channel connected to it.
    pub async fn start(member: &Member, namespace: &str) -> InProcessProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let config = ProxyConfig {
            endpoints: vec![member.endpoint()],
            namespace: namespace.as_bytes().to_vec(),
            max_recv_bytes: 4 << 20,
            max_send_bytes: 4 << 20,
            max_concurrent_streams: 1000,
            ..Default::default()
        };
        let listeners = Listeners {
            main: listener,
            main_tls: None,
            metrics: None,
        };
        let task = tokio::spawn(run(config, None, listeners, shutdown.clone()));
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        InProcessProxy {
            addr,
            channel,
            shutdown,
            task,
        }
    }

    /// Stops the proxy and checks that it stopped cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("proxy task").expect("proxy");
    }
}
