//! TLS on the client and peer ports, with certificates made per test (`TestCa`): etcdctl over
//! https with and without `--client-cert-auth`, an unknown or missing client certificate
//! refused, certificate rotation without restart, a 3-member cluster with peer TLS, and etcd's
//! start-up errors for bad TLS settings. Everything here passes against etcd 3.4 too.

use std::time::Duration;

use etcdrs_testkit::certs::{CertFiles, TestCa, cert_der};
use etcdrs_testkit::{
    ClientTls, Cluster, ClusterOpts, Etcdctl, Member, PeerTls, poll_until, served_certificate,
};

use crate::ours;
use crate::{bin, opts};

const WAIT: Duration = Duration::from_secs(20);

/// A CA with a loopback server certificate and a client certificate (CN `client`).
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    server: CertFiles,
    client: CertFiles,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "ca").expect("CA");
    let server = ca.issue_loopback("server", "server").expect("server cert");
    let client = ca
        .issue(
            "client",
            "client",
            &[],
            etcdrs_testkit::certs::Usage::Client,
        )
        .expect("client cert");
    Pki {
        dir,
        ca,
        server,
        client,
    }
}

fn client_tls(pki: &Pki, client_cert_auth: bool) -> ClientTls {
    ClientTls {
        ca_file: pki.ca.ca_file(),
        server: pki.server.clone(),
        client: Some(pki.client.clone()),
        client_cert_auth,
    }
}

#[tokio::test]
async fn tls_etcdctl_over_https_without_client_cert_auth() {
    let pki = pki();
    let member = Member::start(opts().client_tls(client_tls(&pki, false)))
        .await
        .expect("member starts");
    assert!(member.endpoint().starts_with("https://"));
    let ctl = member.etcdctl();
    assert_eq!(ctl.ok(&["put", "k", "v"]).await, "OK\n");
    // Without --client-cert-auth no certificate is needed: only the CA.
    let no_cert = Etcdctl::new(member.endpoint()).with_tls(&pki.ca.ca_file(), None);
    assert_eq!(no_cert.ok(&["get", "k"]).await, "k\nv\n");
    // A client that does not trust the server's CA gives up.
    let untrusting = Etcdctl::new(member.endpoint())
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    let err = untrusting.fail(&["get", "k"]).await;
    assert!(err.contains("context deadline exceeded"), "{err}");
    // etcd-client over TLS, and /health over https.
    let mut client = member.client().await.expect("client");
    let got = client.get("k", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v");
    let health = member.http_get("/health").await.expect("health");
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn tls_client_cert_auth_refuses_unknown_and_missing_certificates() {
    let pki = pki();
    let member = Member::start(opts().client_tls(client_tls(&pki, true)))
        .await
        .expect("member starts");
    let ctl = member.etcdctl();
    assert_eq!(ctl.ok(&["put", "k", "v"]).await, "OK\n");
    assert_eq!(ctl.ok(&["get", "k"]).await, "k\nv\n");

    // A certificate from another CA is refused at the handshake.
    let other = TestCa::new(&pki.dir.path().join("other"), "other").expect("CA");
    let stranger = other
        .issue(
            "stranger",
            "client",
            &[],
            etcdrs_testkit::certs::Usage::Client,
        )
        .expect("cert");
    let refused = Etcdctl::new(member.endpoint())
        .with_tls(&pki.ca.ca_file(), Some(&stranger))
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    let err = refused.fail(&["put", "k", "stranger"]).await;
    assert!(err.contains("context deadline exceeded"), "{err}");
    // No certificate at all: refused too.
    let anonymous = Etcdctl::new(member.endpoint())
        .with_tls(&pki.ca.ca_file(), None)
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    let err = anonymous.fail(&["put", "k", "anonymous"]).await;
    assert!(err.contains("context deadline exceeded"), "{err}");
    // Nothing changed.
    assert_eq!(ctl.ok(&["get", "k"]).await, "k\nv\n");
}

#[tokio::test]
async fn tls_certificate_rotation_reaches_new_connections() {
    let pki = pki();
    let member = Member::start(opts().client_tls(client_tls(&pki, false)))
        .await
        .expect("member starts");
    let addr = member.client_addr();
    let ca_file = pki.ca.ca_file();
    let first = served_certificate(&addr, &ca_file, None)
        .await
        .expect("handshake");
    assert_eq!(first, cert_der(&pki.server.cert).expect("der"));

    // Rewrite the files in place with a new certificate from the same CA.
    let fresh = pki.ca.issue_loopback("fresh", "server-2").expect("cert");
    std::fs::copy(&fresh.key, &pki.server.key).expect("copy key");
    std::fs::copy(&fresh.cert, &pki.server.cert).expect("copy cert");
    let expected = cert_der(&fresh.cert).expect("der");
    poll_until(WAIT, || async {
        match served_certificate(&addr, &ca_file, None).await {
            Ok(der) if der == expected => Ok(()),
            Ok(_) => Err("still the old certificate".to_string()),
            Err(e) => Err(format!("{e:#}")),
        }
    })
    .await
    .expect("new connections see the new certificate");
    // The rotated server still serves.
    assert_eq!(member.etcdctl().ok(&["put", "k", "v"]).await, "OK\n");
}

#[tokio::test]
async fn tls_three_member_cluster_with_peer_tls() {
    let pki = pki();
    let peer = pki.ca.issue_loopback("peer", "peer").expect("peer cert");
    let opts = ClusterOpts::new(&bin())
        .client_tls(client_tls(&pki, true))
        .peer_tls(PeerTls {
            ca_file: pki.ca.ca_file(),
            cert: peer,
            client_cert_auth: true,
        });
    let cluster = Cluster::start(3, opts).await.expect("cluster starts");
    cluster.leader().await.expect("a leader");
    let m0 = cluster.member(0).etcdctl();
    assert_eq!(m0.ok(&["put", "k", "over-tls"]).await, "OK\n");
    let m2 = cluster.member(2).etcdctl();
    assert_eq!(m2.ok(&["get", "k"]).await, "k\nover-tls\n");
    let members = m2.ok(&["member", "list"]).await;
    assert_eq!(members.matches("https://").count(), 6, "{members}");
}

#[tokio::test]
async fn tls_peer_port_refuses_a_plain_member() {
    // A member whose peer port speaks TLS cannot be reached over plain HTTP: /version on the
    // peer URL over plain HTTP gets no 200.
    let pki = pki();
    let peer_files = pki.ca.issue_loopback("peer", "peer").expect("peer cert");
    let member = Member::start(opts().peer_tls(PeerTls {
        ca_file: pki.ca.ca_file(),
        cert: peer_files.clone(),
        client_cert_auth: true,
    }))
    .await
    .expect("member starts");
    assert!(member.peer_url().starts_with("https://"));
    let addr = format!("{}:{}", member.host(), member.peer_port());
    let plain = etcdrs_testkit::http_get(&addr, "/version").await;
    assert!(
        !plain.is_ok_and(|r| r.status == 200),
        "plain HTTP reached a TLS peer port"
    );
    // Over TLS, with a peer certificate, the port presents the member's peer certificate.
    let peer_client = pki.ca.issue_loopback("peer2", "peer2").expect("cert");
    let served = served_certificate(&addr, &pki.ca.ca_file(), Some(&peer_client))
        .await
        .expect("TLS handshake");
    assert_eq!(served, cert_der(&peer_files.cert).expect("der"));
}

#[tokio::test]
async fn tls_bad_settings_fail_start_up_with_etcds_errors() {
    let pki = pki();
    // An https client URL without certificates.
    let port = etcdrs_testkit::ports::reserve_on(std::net::Ipv4Addr::LOCALHOST).expect("port");
    let url = format!("https://127.0.0.1:{}", port.port());
    let mut member = Member::spawn(
        opts()
            .setting("listen-client-urls", url.clone())
            .setting("advertise-client-urls", url.clone()),
    )
    .expect("spawn");
    let status = member.wait_exit(WAIT).await.expect("exits");
    assert!(!status.success());
    let expected = format!(
        "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
    );
    assert!(member.log_contains(&expected), "{}", member.log_tail(20));

    // An unknown cipher suite.
    let mut member = Member::spawn(
        opts()
            .client_tls(client_tls(&pki, false))
            .setting("cipher-suites", "TLS_NOT_A_SUITE"),
    )
    .expect("spawn");
    let status = member.wait_exit(WAIT).await.expect("exits");
    assert!(!status.success());
    assert!(
        member.log_contains(r#"unexpected TLS cipher suite"#)
            && member.log_contains("TLS_NOT_A_SUITE"),
        "{}",
        member.log_tail(20)
    );

    // A known suite works.
    let member = Member::start(
        opts()
            .client_tls(client_tls(&pki, false))
            .setting("cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    )
    .await
    .expect("member starts");
    assert_eq!(member.etcdctl().ok(&["put", "k", "v"]).await, "OK\n");
}

#[tokio::test]
async fn tls_auto_tls_serves_a_self_signed_certificate() {
    let port = etcdrs_testkit::ports::reserve_on(std::net::Ipv4Addr::LOCALHOST).expect("port");
    let url = format!("https://127.0.0.1:{}", port.port());
    let mut member = Member::spawn(
        opts()
            .setting("listen-client-urls", url.clone())
            .setting("advertise-client-urls", url.clone())
            .setting("auto-tls", "true"),
    )
    .expect("spawn");
    let ctl = Etcdctl::new(url.clone())
        .with_arg("--insecure-transport=false")
        .with_arg("--insecure-skip-tls-verify");
    poll_until(WAIT, || async {
        match ctl.run(&["put", "k", "v"]).await {
            Ok(out) if out.success() => Ok(()),
            Ok(out) => Err(out.stderr),
            Err(e) => Err(format!("{e:#}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", member.log_tail(20)));
    assert!(member.data_dir().join("fixtures/client/cert.pem").exists());
    assert!(member.is_running());
}

#[tokio::test]
async fn tls_client_crl_refuses_revoked_certificates() {
    let pki = pki();
    let revoked = pki
        .ca
        .issue(
            "revoked",
            "revoked",
            &[],
            etcdrs_testkit::certs::Usage::Client,
        )
        .expect("cert");
    // A version 1 certificate (checked outside webpki) is revoked the same way; one not on
    // the list still gets in.
    let revoked_v1 = pki.ca.issue_v1("revoked-v1", "revoked").expect("v1 cert");
    let kept_v1 = pki.ca.issue_v1("kept-v1", "kept").expect("v1 cert");
    let crl = pki.ca.crl("crl", &[&revoked, &revoked_v1]).expect("CRL");
    let member = Member::start(
        opts()
            .client_tls(client_tls(&pki, true))
            .setting("client-crl-file", crl.display().to_string()),
    )
    .await
    .expect("member starts");
    assert_eq!(member.etcdctl().ok(&["put", "k", "v"]).await, "OK\n");
    let refused = Etcdctl::new(member.endpoint())
        .with_tls(&pki.ca.ca_file(), Some(&revoked))
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    let err = refused.fail(&["put", "k", "revoked"]).await;
    assert!(err.contains("context deadline exceeded"), "{err}");
    let refused_v1 = Etcdctl::new(member.endpoint())
        .with_tls(&pki.ca.ca_file(), Some(&revoked_v1))
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    let err = refused_v1.fail(&["put", "k", "revoked"]).await;
    assert!(err.contains("context deadline exceeded"), "{err}");
    let kept = Etcdctl::new(member.endpoint()).with_tls(&pki.ca.ca_file(), Some(&kept_v1));
    assert_eq!(kept.ok(&["get", "k"]).await, "k\nv\n");
    assert_eq!(member.etcdctl().ok(&["get", "k"]).await, "k\nv\n");
}

#[tokio::test]
async fn tls_peer_cert_allowed_cn_refuses_other_members() {
    // The member accepts only peers whose certificate's common name is "m-allowed": a peer
    // with another name (same CA) is cut off after the handshake and gets no answer.
    let pki = pki();
    let allowed = pki.ca.issue_loopback("allowed", "m-allowed").expect("cert");
    let member = Member::start(
        opts()
            .peer_tls(PeerTls {
                ca_file: pki.ca.ca_file(),
                cert: allowed.clone(),
                client_cert_auth: true,
            })
            .setting("peer-cert-allowed-cn", "m-allowed"),
    )
    .await
    .expect("member starts");
    let addr = format!("{}:{}", member.host(), member.peer_port());
    // A peer with the allowed CN completes a request; another CN is cut off.
    let ok = served_certificate(&addr, &pki.ca.ca_file(), Some(&allowed)).await;
    assert!(ok.is_ok(), "{ok:?}");
    let other = pki.ca.issue_loopback("other", "m-other").expect("cert");
    let refused =
        etcdrs_testkit::https_get(&addr, "/version", &pki.ca.ca_file(), Some(&other)).await;
    assert!(
        !refused.is_ok_and(|r| r.status == 200),
        "a peer with another CN was served"
    );
}

/// etcd's `TestCtlV3AuthCertCNWithWithConcurrentOperation`: with `--client-cert-auth`, a client
/// certificate whose Common Name is `root` acts as root. After `auth enable`, one loop adds and
/// deletes users while another puts and deletes keys, all through etcdctl with that
/// certificate; every command completes. Runs on etcd 3.4 too.
#[tokio::test]
async fn tls_root_certificate_under_auth_with_concurrent_user_and_key_changes() {
    let pki = pki();
    let root_cert = pki
        .ca
        .issue("root", "root", &[], etcdrs_testkit::certs::Usage::Client)
        .expect("root cert");
    let member = Member::start(
        opts()
            .client_tls(ClientTls {
                client: Some(root_cert.clone()),
                ..client_tls(&pki, true)
            })
            .setting("bcrypt-cost", "4"),
    )
    .await
    .expect("member starts");
    let ctl = member.etcdctl().with_arg("--command-timeout=10s");
    ctl.ok(&["user", "add", "root:rootpw"]).await;
    assert_eq!(
        ctl.ok(&["auth", "enable"]).await,
        "Authentication Enabled\n"
    );
    let users = async {
        for i in 0..20 {
            let user = format!("testuser-{i}");
            ctl.ok(&["user", "add", &format!("{user}:testpass-{i}")])
                .await;
            ctl.ok(&["user", "delete", &user]).await;
        }
    };
    let keys = async {
        for i in 0..20 {
            let key = format!("key-{i}");
            assert_eq!(ctl.ok(&["put", &key, &format!("value-{i}")]).await, "OK\n");
            assert_eq!(ctl.ok(&["del", &key]).await, "1\n");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(users, keys) })
        .await
        .expect("every command completes");
    assert_eq!(ctl.ok(&["user", "list"]).await, "root\n");
    // The same from one client connection (etcd-client), both loops at once. etcd answers a
    // write that a user change overtook with "revision of auth store is old" and leaves the
    // retry to Go's client; ours proposes it again under the new revision, as the caller did
    // nothing stale, so clients without that retry (this crate, Python's) complete too.
    if !ours() {
        return;
    }
    let client =
        etcd_client::Client::connect([member.endpoint()], Some(member.connect_options(None)))
            .await
            .expect("connect");
    let (mut a, mut b) = (client.clone(), client.clone());
    let users = async move {
        for i in 0..100 {
            let user = format!("u-{i}");
            a.user_add(user.as_str(), "pw", None)
                .await
                .expect("user add");
            a.user_delete(user.as_str()).await.expect("user delete");
        }
    };
    let keys = async move {
        for i in 0..100 {
            let key = format!("k-{i}");
            b.put(key.as_str(), "v", None).await.expect("put");
            b.delete(key.as_str(), None).await.expect("delete");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(users, keys) })
        .await
        .expect("every call completes");
}

/// A member with client TLS and `--client-cert-auth`, etcdctl with a certificate whose Common
/// Name is `root` and nothing else (no `--user`): `user add root` (with a password, and with
/// `--no-password`), `auth enable` (etcdctl's loop: refused for the missing root role, then
/// `role add root`, `user grant-role root root` and again), then puts and gets at once from
/// many etcdctl processes and from one client connection opened before auth was enabled. Each
/// step finishes, within a deadline, on etcd 3.4 and on ours, at etcd's default bcrypt cost.
///
/// The certificate is made both ways: version 3 (rcgen) and version 1, as `openssl x509 -req`
/// makes it without an extensions file. Go accepts a version 1 client certificate; webpki
/// refused it in the handshake (`UnsupportedCertVersion`), so against etcd-rs every etcdctl
/// call with such a certificate retried until its timeout: etcdctl hung at the first step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_root_certificate_then_auth_enable_then_concurrent_puts_and_gets() {
    let pki = pki();
    let root_v3 = pki
        .ca
        .issue("root", "root", &[], etcdrs_testkit::certs::Usage::Client)
        .expect("root cert");
    let root_v1 = pki.ca.issue_v1("root-v1", "root").expect("root v1 cert");
    let other_dir = tempfile::tempdir().expect("temp dir");
    let other_root_v1 = TestCa::new(other_dir.path(), "ca")
        .and_then(|other| other.issue_v1("root-v1", "root"))
        .expect("a v1 cert of another CA");
    let mut servers = vec![bin()];
    if ours() {
        servers.push(etcdrs_testkit::EtcdBin::at("/usr/bin/etcd"));
    }
    for server in servers {
        for (root_cert, password) in [
            (&root_v3, "--new-user-password=rootpw"),
            (&root_v1, "--no-password"),
        ] {
            let what = format!(
                "{} {} {password}",
                server.path().display(),
                root_cert.cert.display()
            );
            // The testkit's probes and the client connection present the version 3
            // certificate (rustls refuses to present a version 1 one); etcdctl `root_cert`.
            let member = Member::start(etcdrs_testkit::MemberOpts::new(&server).client_tls(
                ClientTls {
                    client: Some(root_v3.clone()),
                    ..client_tls(&pki, true)
                },
            ))
            .await
            .expect("member starts");
            let early = etcd_client::Client::connect(
                [member.endpoint()],
                Some(member.connect_options(None)),
            )
            .await
            .expect("connect");
            early
                .kv_client()
                .put("before", "auth", None)
                .await
                .expect("put before auth");
            let ctl = Etcdctl::new(member.endpoint()).with_tls(&pki.ca.ca_file(), Some(root_cert));
            let step = |args: &'static [&'static str]| {
                let ctl = ctl.clone();
                async move {
                    tokio::time::timeout(WAIT, ctl.ok(args))
                        .await
                        .unwrap_or_else(|_| panic!("etcdctl {args:?} did not finish in {WAIT:?}"))
                }
            };
            let add: &'static [&'static str] = if password == "--no-password" {
                &["user", "add", "root", "--no-password"]
            } else {
                &["user", "add", "root", "--new-user-password=rootpw"]
            };
            assert_eq!(step(add).await, "User root created\n", "{what}");
            assert_eq!(
                step(&["auth", "enable"]).await,
                "Authentication Enabled\n",
                "{what}"
            );
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..10 {
                let ctl = ctl.clone();
                tasks.spawn(async move {
                    let key = format!("k{i}");
                    let value = format!("v{i}");
                    assert_eq!(ctl.ok(&["put", &key, &value]).await, "OK\n");
                    assert_eq!(ctl.ok(&["get", &key]).await, format!("{key}\n{value}\n"));
                });
                let mut kv = early.kv_client();
                tasks.spawn(async move {
                    let key = format!("early{i}");
                    kv.put(key.as_str(), "x", None)
                        .await
                        .expect("put after auth enable");
                    let got = kv
                        .get(key.as_str(), None)
                        .await
                        .expect("get after auth enable");
                    assert_eq!(got.kvs().len(), 1);
                });
            }
            tokio::time::timeout(WAIT, async {
                while let Some(done) = tasks.join_next().await {
                    done.expect("a put and a get");
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what}: puts and gets did not finish in {WAIT:?}"));
            let keys = ctl.ok(&["get", "k", "--prefix", "--keys-only"]).await;
            assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 10, "{what}");
            // A version 1 certificate from another CA of the same name is refused.
            let forged = Etcdctl::new(member.endpoint())
                .with_tls(&pki.ca.ca_file(), Some(&other_root_v1))
                .with_arg("--dial-timeout=1s")
                .with_arg("--command-timeout=2s");
            let refused = forged.fail(&["get", "k"]).await;
            assert!(
                refused.contains("context deadline exceeded"),
                "{what}: {refused}"
            );
        }
    }
}

/// A member refused by its peer's `--peer-cert-allowed-cn` says why, in etcd's words
/// (`remote error: tls: bad certificate`, what operators grep for): the refusal happens in the
/// handshake, with the alert Go sends. Runs on etcd 3.4 too.
#[tokio::test]
async fn tls_member_refused_by_peer_cert_allowed_cn_logs_bad_certificate() {
    let pki = pki();
    let allowed = pki.ca.issue_loopback("allowed", "m-allowed").expect("cert");
    let other = pki.ca.issue_loopback("other", "m-other").expect("cert");
    let host = std::net::Ipv4Addr::LOCALHOST;
    let reserve = || etcdrs_testkit::ports::reserve_on(host).expect("port");
    let (a_client, a_peer, b_client, b_peer) = (reserve(), reserve(), reserve(), reserve());
    let url = |port: &etcdrs_testkit::ports::PortLease| format!("https://{host}:{}", port.port());
    let (a_url, b_url) = (url(&a_peer), url(&b_peer));
    let peer_tls = |cert: &CertFiles| PeerTls {
        ca_file: pki.ca.ca_file(),
        cert: cert.clone(),
        client_cert_auth: true,
    };
    let a = Member::spawn_on(
        opts()
            .name("a")
            .initial_peers([("b", b_url)])
            .peer_tls(peer_tls(&allowed))
            .setting("peer-cert-allowed-cn", "m-allowed"),
        a_client,
        a_peer,
    )
    .expect("a spawns");
    let b = Member::spawn_on(
        opts()
            .name("b")
            .initial_peers([("a", a_url)])
            .peer_tls(peer_tls(&other)),
        b_client,
        b_peer,
    )
    .expect("b spawns");
    let logged = poll_until(Duration::from_secs(20), || async {
        anyhow::ensure!(
            b.log_contains("remote error: tls: bad certificate"),
            "not logged yet"
        );
        Ok(())
    })
    .await;
    assert!(
        logged.is_ok(),
        "the refused member does not say why:\n{}\n--- the refusing member:\n{}",
        b.log_tail(20),
        a.log_tail(20)
    );
}

#[tokio::test]
async fn tls_https_metrics_url_serves_with_the_client_certificate() {
    let pki = pki();
    let port = etcdrs_testkit::ports::reserve_on(std::net::Ipv4Addr::LOCALHOST).expect("port");
    let metrics = format!("https://127.0.0.1:{}", port.port());
    let member = Member::start(
        opts()
            .client_tls(client_tls(&pki, false))
            .setting("listen-metrics-urls", metrics),
    )
    .await
    .expect("member starts");
    let addr = format!("127.0.0.1:{}", port.port());
    let served = served_certificate(&addr, &pki.ca.ca_file(), None)
        .await
        .expect("TLS handshake");
    assert_eq!(served, cert_der(&pki.server.cert).expect("der"));
    let reply = etcdrs_testkit::https_get(&addr, "/metrics", &pki.ca.ca_file(), None)
        .await
        .expect("GET /metrics");
    assert_eq!(reply.status, 200);
    assert!(
        reply.body.contains("etcd_server_has_leader"),
        "{}",
        &reply.body[..200.min(reply.body.len())]
    );
    drop(member);
}

#[tokio::test]
async fn tls_three_member_cluster_with_peer_auto_tls() {
    let cluster = Cluster::start(3, ClusterOpts::new(&bin()).peer_auto_tls())
        .await
        .expect("cluster starts");
    cluster.leader().await.expect("a leader");
    let ctl = cluster.etcdctl();
    assert_eq!(ctl.ok(&["put", "k", "auto"]).await, "OK\n");
    let m1 = cluster.member(1).etcdctl();
    assert_eq!(m1.ok(&["get", "k"]).await, "k\nauto\n");
    for i in 0..3 {
        let dir = cluster.member(i).data_dir().join("fixtures/peer");
        assert!(
            dir.join("cert.pem").exists(),
            "member {i}: no self-signed certificate"
        );
    }
}

#[tokio::test]
async fn tls_min_version_refuses_older_clients() {
    if !ours() {
        return; // etcd 3.5 flags.
    }
    let pki = pki();
    let default = Member::start(opts().client_tls(client_tls(&pki, false)))
        .await
        .expect("member starts");
    etcdrs_testkit::tls12_handshake(&default.client_addr(), &pki.ca.ca_file())
        .await
        .expect("TLS 1.2 accepted by default");
    let strict = Member::start(
        opts()
            .client_tls(client_tls(&pki, false))
            .setting("tls-min-version", "TLS1.3"),
    )
    .await
    .expect("member starts");
    let refused = etcdrs_testkit::tls12_handshake(&strict.client_addr(), &pki.ca.ca_file()).await;
    assert!(
        refused.is_err(),
        "TLS 1.2 accepted despite --tls-min-version TLS1.3"
    );
    assert_eq!(strict.etcdctl().ok(&["put", "k", "v"]).await, "OK\n");
}

#[tokio::test]
async fn tls_peer_cert_allowed_hostname_refuses_other_members() {
    let pki = pki();
    let member_cert = pki.ca.issue_loopback("member", "member").expect("cert");
    let member = Member::start(
        opts()
            .peer_tls(PeerTls {
                ca_file: pki.ca.ca_file(),
                cert: member_cert.clone(),
                client_cert_auth: true,
            })
            .setting("peer-cert-allowed-hostname", "localhost"),
    )
    .await
    .expect("member starts");
    let addr = format!("{}:{}", member.host(), member.peer_port());
    // A peer certificate valid for another host name only is cut off after the handshake.
    let other = pki
        .ca
        .issue(
            "other",
            "other",
            &["other.example"],
            etcdrs_testkit::certs::Usage::Both,
        )
        .expect("cert");
    let refused =
        etcdrs_testkit::https_get(&addr, "/version", &pki.ca.ca_file(), Some(&other)).await;
    assert!(
        !refused.is_ok_and(|r| r.status == 200),
        "a peer certificate for another host name was served"
    );
    // The member's own kind of certificate (valid for localhost) is accepted.
    let ok = served_certificate(&addr, &pki.ca.ca_file(), Some(&member_cert)).await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn tls_max_version_refuses_newer_clients() {
    if !ours() {
        return; // etcd 3.5 flags.
    }
    let pki = pki();
    let default = Member::start(opts().client_tls(client_tls(&pki, false)))
        .await
        .expect("member starts");
    etcdrs_testkit::tls13_handshake(&default.client_addr(), &pki.ca.ca_file())
        .await
        .expect("TLS 1.3 accepted by default");
    let capped = Member::start(
        opts()
            .client_tls(client_tls(&pki, false))
            .setting("tls-max-version", "TLS1.2"),
    )
    .await
    .expect("member starts");
    let refused = etcdrs_testkit::tls13_handshake(&capped.client_addr(), &pki.ca.ca_file()).await;
    assert!(
        refused.is_err(),
        "TLS 1.3 accepted despite --tls-max-version TLS1.2"
    );
    etcdrs_testkit::tls12_handshake(&capped.client_addr(), &pki.ca.ca_file())
        .await
        .expect("TLS 1.2 still accepted");
    assert_eq!(capped.etcdctl().ok(&["put", "k", "v"]).await, "OK\n");
}

/// `--client-cert-allowed-hostname`: with client certificate auth, only a client certificate
/// valid for that host name is served.
#[tokio::test]
async fn tls_client_cert_allowed_hostname_refuses_other_clients() {
    if !ours() {
        return; // etcd 3.5 flag.
    }
    let pki = pki();
    let allowed = pki
        .ca
        .issue(
            "allowed",
            "allowed",
            &["client.example"],
            etcdrs_testkit::certs::Usage::Client,
        )
        .expect("cert");
    // The test kit's own probes present the allowed certificate.
    let tls = ClientTls {
        client: Some(allowed.clone()),
        ..client_tls(&pki, true)
    };
    let member = Member::start(
        opts()
            .client_tls(tls)
            .setting("client-cert-allowed-hostname", "client.example"),
    )
    .await
    .expect("member starts");
    let ok = Etcdctl::new(member.endpoint()).with_tls(&pki.ca.ca_file(), Some(&allowed));
    assert_eq!(ok.ok(&["put", "k", "v"]).await, "OK\n");
    let refused = Etcdctl::new(member.endpoint())
        .with_tls(&pki.ca.ca_file(), Some(&pki.client))
        .with_arg("--dial-timeout=1s")
        .with_arg("--command-timeout=2s");
    refused.fail(&["put", "k", "other"]).await;
    assert_eq!(ok.ok(&["get", "k", "--print-value-only"]).await, "v\n");
}

/// `--peer-crl-file`: a peer whose certificate the list revokes is refused; the member's own
/// kind of certificate is not.
#[tokio::test]
async fn tls_peer_crl_refuses_revoked_peers() {
    let pki = pki();
    let member_cert = pki.ca.issue_loopback("member", "member").expect("cert");
    let revoked = pki.ca.issue_loopback("revoked", "revoked").expect("cert");
    let crl = pki.ca.crl("peer-crl", &[&revoked]).expect("CRL");
    let member = Member::start(
        opts()
            .peer_tls(PeerTls {
                ca_file: pki.ca.ca_file(),
                cert: member_cert.clone(),
                client_cert_auth: true,
            })
            .setting("peer-crl-file", crl.display().to_string()),
    )
    .await
    .expect("member starts");
    let addr = format!("{}:{}", member.host(), member.peer_port());
    let ok = etcdrs_testkit::https_get(&addr, "/version", &pki.ca.ca_file(), Some(&member_cert))
        .await
        .expect("served");
    assert_eq!(ok.status, 200);
    let refused =
        etcdrs_testkit::https_get(&addr, "/version", &pki.ca.ca_file(), Some(&revoked)).await;
    assert!(
        !refused.is_ok_and(|r| r.status == 200),
        "a revoked peer certificate was served"
    );
}

/// `--self-signed-cert-validity`: the certificates `--auto-tls` makes are valid for that many
/// years (one by default).
#[tokio::test]
async fn tls_self_signed_cert_validity_sets_the_years() {
    if !ours() {
        return; // etcd 3.5 flag.
    }
    // The year the member's auto-TLS client certificate expires, once the file is complete.
    let not_after_year = |member: &Member| {
        let pem = member.data_dir().join("fixtures/client/cert.pem");
        let out = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-enddate", "-in"])
            .arg(&pem)
            .output()
            .ok()?;
        // notAfter=Dec  1 23:59:59 2029 GMT
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().rev().nth(1)?.parse::<i32>().ok()
    };
    let start_auto_tls = |extra: &'static [(&'static str, &'static str)]| async move {
        let port = etcdrs_testkit::ports::reserve_on(std::net::Ipv4Addr::LOCALHOST).expect("port");
        let url = format!("https://127.0.0.1:{}", port.port());
        let mut o = opts()
            .setting("listen-client-urls", url.clone())
            .setting("advertise-client-urls", url.clone())
            .setting("auto-tls", "true");
        for (flag, value) in extra {
            o = o.setting(*flag, *value);
        }
        let member = Member::spawn(o).expect("spawn");
        let year = poll_until(WAIT, || async {
            not_after_year(&member).ok_or("no complete certificate yet")
        })
        .await
        .expect("auto-tls certificate");
        (member, year)
    };
    let (_default, one) = start_auto_tls(&[]).await;
    let (_three, three) = start_auto_tls(&[("self-signed-cert-validity", "3")]).await;
    assert_eq!(three - one, 2);
}

/// `--peer-client-cert-file` and `--peer-client-key-file`: members present that certificate
/// when they dial each other. Only its common name is allowed in (`--peer-cert-allowed-cn`),
/// so the cluster forms only if every member dials with it rather than with its server
/// certificate.
#[tokio::test]
async fn tls_peer_client_certificate_is_what_members_dial_with() {
    if !ours() {
        return; // etcd 3.5 flags.
    }
    let pki = pki();
    let server = pki
        .ca
        .issue_loopback("peer", "peer-server")
        .expect("peer cert");
    let dialer = pki
        .ca
        .issue(
            "peer-client",
            "peer-client",
            &[],
            etcdrs_testkit::certs::Usage::Client,
        )
        .expect("peer client cert");
    let opts = ClusterOpts::new(&bin())
        .peer_tls(PeerTls {
            ca_file: pki.ca.ca_file(),
            cert: server,
            client_cert_auth: true,
        })
        .arg(format!("--peer-client-cert-file={}", dialer.cert.display()))
        .arg(format!("--peer-client-key-file={}", dialer.key.display()))
        .arg("--peer-cert-allowed-cn=peer-client");
    let cluster = Cluster::start(3, opts).await.expect("cluster starts");
    cluster.leader().await.expect("a leader");
    let m0 = cluster.member(0).etcdctl();
    assert_eq!(m0.ok(&["put", "k", "v"]).await, "OK\n");
    let m2 = cluster.member(2).etcdctl();
    assert_eq!(m2.ok(&["get", "k", "--print-value-only"]).await, "v\n");
}
