//! The client port's front service: KV calls (the bulk of a member's traffic: every put, range,
//! txn and delete) go straight to the KV service (`http::unary`, tonic's KV service for what it
//! does not handle itself); every other request goes through the axum router with its layers.
//!
//! Why: the router costs each request a path lookup, a boxed future per layer (the
//! require-leader and size-error middlewares, the merged routers) and a boxed body per
//! wrapper; measured under `etcd-benchmark put` with 100 clients, that was about a tenth of
//! the member's CPU. A KV call needs none of it but what is done here: a KV call that asks
//! for a leader (`hasleader`) takes the router's path, so its check stays in one place
//! (`etcdrs_serve::leader`), and tonic's size refusal gets grpc-go's text as the router's
//! layer gives it. The answers are the same whichever way a request goes.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use futures::FutureExt;
use futures::future::{BoxFuture, Either};
use tower::Service;

use super::unary::{DirectKv, KV_PREFIX};

type KvFuture = BoxFuture<'static, Result<Response, Infallible>>;

/// The front service of a listener that serves gRPC (see the module docs).
#[derive(Clone)]
pub(super) struct Dispatch {
    /// The KV service (tonic's as the router holds it, same limits, behind it); `None` where
    /// the listener serves no gRPC.
    kv: Option<DirectKv>,
    router: Router,
}

impl Dispatch {
    pub(super) fn new(kv: Option<DirectKv>, router: Router) -> Dispatch {
        Dispatch { kv, router }
    }

    /// Whether `request` takes the direct path.
    fn direct(request: &Request<impl Sized>) -> bool {
        request.uri().path().starts_with(KV_PREFIX)
            && !etcdrs_serve::leader::requires_leader(request.headers())
    }
}

impl<B> Service<Request<B>> for Dispatch
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<KvFuture, <Router as Service<Request<B>>>::Future>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both the router and tonic's services are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match &mut self.kv {
            Some(kv) if Dispatch::direct(&request) => {
                Either::Left(kv.clone().call(request).map(Ok).boxed())
            }
            _ => Either::Right(self.router.call(request)),
        }
    }
}
