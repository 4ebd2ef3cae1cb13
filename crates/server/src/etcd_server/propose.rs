//! Proposing requests through raft and waiting for their outcome (etcd's `processInternalRaftRequestOnce`), linearizable reads' barrier (ReadIndex, then the applied index), and the quota check that comes before a write.

use std::time::Instant;

use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::{
    AlarmRequest, AlarmRequest as AlarmReq, AlarmResponse, AlarmType, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest, PutResponse,
    TxnRequest, TxnResponse,
};
use etcdrs_proto::rpctypes;
use tokio::sync::oneshot;

use super::{
    ApplyOutput, EtcdServer, Inner, KV_OVERHEAD, MAX_AUTH_RETRIES, MAX_GAP_APPLY_COMMIT,
    READ_INDEX_RETRY,
};
use crate::error::{Result, ServerError};
use crate::request::Op;

/// A client request that goes through raft, with the typed answer its apply produces: handlers
/// call [`EtcdServer::request`] and get that answer, never a sum of every kind.
pub trait Proposal: Send + Sized {
    /// What applying it answers.
    type Response;
    /// The raft request carrying it.
    fn into_op(self) -> Op;
    /// The answer, out of what the applier produced for this request.
    fn answer(output: ApplyOutput) -> Option<Self::Response>;
}

macro_rules! proposal {
    ($($request:ty => $variant:ident($response:ty),)*) => {$(
        impl Proposal for $request {
            type Response = $response;
            fn into_op(self) -> Op {
                Op::$variant(self)
            }
            fn answer(output: ApplyOutput) -> Option<$response> {
                match output {
                    ApplyOutput::$variant(response) => Some(response),
                    _ => None,
                }
            }
        }
    )*};
}

proposal! {
    PutRequest => Put(PutResponse),
    DeleteRangeRequest => DeleteRange(DeleteRangeResponse),
    TxnRequest => Txn(TxnResponse),
    CompactionRequest => Compaction(CompactionResponse),
    LeaseGrantRequest => LeaseGrant(LeaseGrantResponse),
    LeaseRevokeRequest => LeaseRevoke(LeaseRevokeResponse),
    AlarmReq => Alarm(AlarmResponse),
}

impl EtcdServer {
    /// Propose `request` on behalf of `auth` and wait for its typed answer.
    pub async fn request<R: Proposal>(
        &self,
        request: R,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<R::Response> {
        let output = self.propose_as(request.into_op(), auth).await?;
        R::answer(output).ok_or_else(mismatched_answer)
    }

    /// Propose an auth change (or Authenticate) on behalf of `auth`; Authenticate's answer is
    /// its token, the others' is empty.
    pub async fn request_auth(
        &self,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<String> {
        match self.propose_as(op, auth).await? {
            ApplyOutput::Auth(token) => Ok(token),
            _ => Err(mismatched_answer()),
        }
    }

    /// Wait until every write committed before this call is applied (ReadIndex).
    pub async fn linearizable_barrier(&self) -> Result<()> {
        // raft silently drops a read index that a new leader cannot serve yet; etcd retries
        // every 500 ms (`readIndexRetryTime`), and so do we, within the request timeout.
        let deadline = Instant::now() + self.core.request_timeout;
        loop {
            let attempt = tokio::time::timeout(READ_INDEX_RETRY, self.core.raft.read_index()).await;
            match attempt {
                Ok(Ok(index)) => return self.wait_applied(index).await,
                Ok(Err(etcdrs_raftnode::Error::ProposalDropped)) | Err(_) => {
                    if attempt.is_err() {
                        crate::metrics::SLOW_READ_INDEXES.inc();
                    }
                    if Instant::now() >= deadline {
                        crate::metrics::READ_INDEXES_FAILED.inc();
                        return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
                    }
                    if attempt.is_ok() {
                        // No leader yet: wait a heartbeat before asking again.
                        tokio::time::sleep(self.inner.config.heartbeat_interval).await;
                    }
                }
                Ok(Err(e)) => {
                    crate::metrics::READ_INDEXES_FAILED.inc();
                    return Err(e.into());
                }
            }
        }
    }

    pub(super) async fn wait_applied(&self, index: u64) -> Result<()> {
        let mut applied = self.inner.applied.subscribe();
        let wait = applied.wait_for(|applied| *applied >= index);
        match tokio::time::timeout(self.core.request_timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => Err(ServerError::Etcd(&rpctypes::TIMEOUT)),
        }
    }

    /// Whether a write of about `cost` bytes fits the quota; raises the NOSPACE alarm when not.
    pub async fn check_quota(&self, cost: u64) -> Result<()> {
        if self.has_alarm(AlarmType::Nospace) {
            return Err(ServerError::Etcd(&rpctypes::NO_SPACE));
        }
        // etcd compares the file size; redb's file starts larger and grows in bigger steps than
        // bbolt's, so the quota is checked against the data actually stored.
        let size = self.inner.store.backend().stored_bytes();
        if size.saturating_add(cost + KV_OVERHEAD) <= self.inner.config.quota_bytes() {
            return Ok(());
        }
        tracing::warn!(
            quota_size = self.inner.config.quota_bytes(),
            db_size = size,
            "database space exceeded; raising NOSPACE alarm"
        );
        let activate = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.inner.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let _ = self.propose(Op::Alarm(activate)).await;
        Err(ServerError::Etcd(&rpctypes::NO_SPACE))
    }

    /// Propose a request through raft and wait for its applied result.
    pub async fn propose(&self, op: Op) -> Result<ApplyOutput> {
        self.propose_as(op, None).await
    }

    /// Propose a request on behalf of `auth` (checked against its permissions when applied).
    /// An identity whose revision is live and that an auth change overtook between the check
    /// and the apply is proposed again under the new revision (etcd's `raftRequest` loop), at
    /// most [`MAX_AUTH_RETRIES`] times.
    pub async fn propose_as(
        &self,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<ApplyOutput> {
        let Some(info) = auth.filter(|info| info.live) else {
            return self.propose_once(op, auth).await;
        };
        let mut info = info.clone();
        let mut tries = 0;
        loop {
            let outcome = self.propose_once(op.clone(), Some(&info)).await;
            let current = self.inner.auth.revision();
            match outcome {
                Err(ServerError::Etcd(e))
                    if *e == rpctypes::AUTH_OLD_REVISION
                        && current > info.revision
                        && tries < MAX_AUTH_RETRIES =>
                {
                    info.revision = current;
                    tries += 1;
                }
                outcome => return outcome,
            }
        }
    }

    pub(super) async fn propose_once(
        &self,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<ApplyOutput> {
        let log = self.core.raft.log_state();
        if log.commit > log.applied + MAX_GAP_APPLY_COMMIT {
            return Err(ServerError::Etcd(&rpctypes::TOO_MANY_REQUESTS));
        }
        let id = self.core.ids.next();
        let proposer = auth.map(|info| crate::request::Proposer {
            username: info.username.clone(),
            auth_revision: info.revision,
        });
        let data = crate::request::encode(id, proposer.as_ref(), op, self.publish_form());
        if data.len() as u64 > self.inner.config.max_request_bytes {
            return Err(ServerError::Etcd(&rpctypes::REQUEST_TOO_LARGE));
        }
        let (done, result) = oneshot::channel();
        self.inner.waiters.lock().insert(id, done);
        // Released however the wait ends, also when the client goes away mid-proposal and
        // this future is dropped.
        let _pending = Pending {
            inner: &self.inner,
            id,
        };
        crate::metrics::PROPOSALS_PENDING.inc();
        let outcome = self.wait_proposal(id, data, result, log.term).await;
        let failed = matches!(
            &outcome,
            Err(ServerError::Etcd(e)) if **e == rpctypes::TIMEOUT
                || **e == rpctypes::TIMEOUT_DUE_TO_LEADER_FAIL
                || **e == rpctypes::NO_LEADER
        );
        if failed {
            crate::metrics::PROPOSALS_FAILED.inc();
        }
        outcome
    }

    /// Propose `data` (request `id`) and wait for its answer; `raft_term` is raft's term as
    /// the proposal was made.
    pub(super) async fn wait_proposal(
        &self,
        id: u64,
        data: Vec<u8>,
        result: oneshot::Receiver<Result<ApplyOutput>>,
        raft_term: u64,
    ) -> Result<ApplyOutput> {
        let inner = self.inner.clone();
        let on_refused = move |e: etcdrs_raftnode::Error| {
            if let Some(waiter) = inner.waiters.lock().remove(&id) {
                let _ = waiter.send(Err(match e {
                    etcdrs_raftnode::Error::ProposalDropped => {
                        ServerError::Etcd(&rpctypes::NO_LEADER)
                    }
                    e => e.into(),
                }));
            }
        };
        // The raft status is published after each apply: the applied term may be ahead of it.
        let term = raft_term.max(self.applied_term());
        if let Err(e) = self.core.raft.propose(data, on_refused).await {
            self.inner.waiters.lock().remove(&id);
            return Err(e.into());
        }
        let outcome = tokio::select! {
            answered = tokio::time::timeout(self.core.request_timeout, result) => answered.ok(),
            () = self.leader_lost_proposal(term) => None,
        };
        match outcome {
            Some(Ok(output)) => output,
            Some(Err(_)) => Err(ServerError::Stopped),
            None => {
                self.inner.waiters.lock().remove(&id);
                // etcd's `parseProposeCtxErr`: a leader change during the wait is named.
                if self.applied_term() > term {
                    Err(ServerError::Etcd(&rpctypes::TIMEOUT_DUE_TO_LEADER_FAIL))
                } else {
                    Err(ServerError::Etcd(&rpctypes::TIMEOUT))
                }
            }
        }
    }

    /// Resolves when a proposal made in `term` has most likely gone with its leader: an
    /// entry of a later term has applied (a new leader's first entry comes after every
    /// earlier entry that survives the change), and a grace of two heartbeats has passed
    /// for a proposal that a deposed leader forwarded into the new term. etcd makes such a
    /// client wait out its whole request timeout (5 s + 2 election timeouts) for the same
    /// answer; the outcome is as unknown as after that timeout, only known sooner.
    async fn leader_lost_proposal(&self, term: u64) {
        let mut applied_term = self.inner.applied_term.subscribe();
        if applied_term
            .wait_for(|applied| *applied > term)
            .await
            .is_err()
        {
            return std::future::pending().await;
        }
        tokio::time::sleep(2 * self.inner.config.heartbeat_interval).await;
    }
}

/// A proposal being waited on: dropping it forgets the waiter (a no-op once the applier
/// answered) and counts the proposal out of `etcd_server_proposals_pending`.
struct Pending<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.inner.waiters.lock().remove(&self.id);
        crate::metrics::PROPOSALS_PENDING.dec();
    }
}

/// The applier answered a request with another kind's answer: a bug, not a client's error.
fn mismatched_answer() -> ServerError {
    debug_assert!(
        false,
        "the applier answered a request with another kind's answer"
    );
    ServerError::Fatal("the applier answered a request with another kind's answer".into())
}
