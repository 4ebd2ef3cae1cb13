//! etcd's gRPC error table: the status code and the exact message of every
//! error an etcd server sends (Go package `api/v3rpc/rpctypes`).
//!
//! The messages are protocol data. etcd clients recognise a typed error by
//! comparing the status message with their own table, so every string here
//! must stay byte-identical to etcd's, and every code must match too.
//!
//! Coverage: everything in etcd 3.4.23 plus the 3.5 additions (permission
//! not given, the downgrade errors, request canceled / deadline exceeded).
//! Codes are the 3.4/3.5 ones; etcd 3.6 moved `NOT_CAPABLE`,
//! `GRPC_NOT_SUPPORTED_FOR_LEARNER` and `CLUSTER_VERSION_UNAVAILABLE` to
//! `FailedPrecondition`, which stock 3.4/3.5 clients do not expect.
//!
//! gRPC's own "trying to send message larger than max" (`ResourceExhausted`)
//! is produced by the transport and is not part of this table;
//! [`REQUEST_TOO_LARGE`] is etcd's own check on the request size.

use std::fmt;

use tonic::Code;

/// One etcd server error: a gRPC status code with etcd's exact message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtcdError {
    /// gRPC status code sent with the error.
    pub code: Code,
    /// Status message, byte-identical to etcd's.
    pub message: &'static str,
}

impl EtcdError {
    /// The gRPC status a server sends for this error.
    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.code, self.message)
    }

    /// Looks up the error whose message is exactly `msg`.
    ///
    /// Like etcd's client, this matches on the message only; the code is not
    /// consulted.
    pub fn from_message(msg: &str) -> Option<&'static EtcdError> {
        from_message(msg)
    }
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl std::error::Error for EtcdError {}

impl From<EtcdError> for tonic::Status {
    fn from(err: EtcdError) -> Self {
        err.to_status()
    }
}

impl From<&EtcdError> for tonic::Status {
    fn from(err: &EtcdError) -> Self {
        err.to_status()
    }
}

/// Looks up the error whose message is exactly `msg` (see
/// [`EtcdError::from_message`]).
pub fn from_message(msg: &str) -> Option<&'static EtcdError> {
    ALL.iter().find(|e| e.message == msg)
}

/// Decodes a received status into a known etcd error, by its message.
pub fn from_status(status: &tonic::Status) -> Option<&'static EtcdError> {
    from_message(status.message())
}

/// Declares each error as a constant and collects all of them in [`ALL`], so
/// the lookup table cannot miss one.
macro_rules! etcd_errors {
    ($( $(#[$doc:meta])* $name:ident = $code:ident, $msg:literal; )*) => {
        $(
            $(#[$doc])*
            pub const $name: EtcdError = EtcdError { code: Code::$code, message: $msg };
        )*

        /// Every error of the table, in declaration order.
        pub static ALL: &[EtcdError] = &[$($name),*];
    };
}

etcd_errors! {
    // --- requests on the key space -----------------------------------------

    /// `ErrGRPCEmptyKey`: the request has no key.
    EMPTY_KEY = InvalidArgument, "etcdserver: key is not provided";
    /// `ErrGRPCKeyNotFound`: put with ignore_value/ignore_lease on a missing key.
    KEY_NOT_FOUND = InvalidArgument, "etcdserver: key not found";
    /// `ErrGRPCValueProvided`: ignore_value set together with a value.
    VALUE_PROVIDED = InvalidArgument, "etcdserver: value is provided";
    /// `ErrGRPCLeaseProvided`: ignore_lease set together with a lease.
    LEASE_PROVIDED = InvalidArgument, "etcdserver: lease is provided";
    /// `ErrGRPCTooManyOps`: a txn branch exceeds the operation limit.
    TOO_MANY_OPS = InvalidArgument, "etcdserver: too many operations in txn request";
    /// `ErrGRPCDuplicateKey`: a txn writes the same key twice.
    DUPLICATE_KEY = InvalidArgument, "etcdserver: duplicate key given in txn request";
    /// `ErrGRPCCompacted`: the requested revision has been compacted.
    COMPACTED = OutOfRange, "etcdserver: mvcc: required revision has been compacted";
    /// `ErrGRPCFutureRev`: the requested revision is above the current one.
    FUTURE_REV = OutOfRange, "etcdserver: mvcc: required revision is a future revision";
    /// `ErrGRPCNoSpace`: the backend quota is exhausted (NOSPACE alarm).
    NO_SPACE = ResourceExhausted, "etcdserver: mvcc: database space exceeded";
    /// `ErrGRPCInvalidSortOption` (etcd 3.7): a sort order or target that is not one of the
    /// enum's values; etcd-rs checks it on RangeStream, which came with it (3.5's Range does
    /// not check).
    INVALID_SORT_OPTION = InvalidArgument, "etcdserver: invalid sort option";

    // --- leases ---------------------------------------------------------------

    /// `ErrGRPCLeaseNotFound`: no lease with that ID.
    LEASE_NOT_FOUND = NotFound, "etcdserver: requested lease not found";
    /// `ErrGRPCLeaseExist`: a lease with the requested ID already exists.
    LEASE_EXIST = FailedPrecondition, "etcdserver: lease already exists";
    /// `ErrGRPCLeaseTTLTooLarge`: the requested TTL is above the maximum.
    LEASE_TTL_TOO_LARGE = OutOfRange, "etcdserver: too large lease TTL";

    // --- watch ------------------------------------------------------------------

    /// `ErrGRPCWatchCanceled`: the watch was canceled (not in etcd's client
    /// decode map).
    WATCH_CANCELED = Cancelled, "etcdserver: watch canceled";

    // --- membership -------------------------------------------------------------

    /// `ErrGRPCMemberExist`: the member ID is already in the cluster.
    MEMBER_EXIST = FailedPrecondition, "etcdserver: member ID already exist";
    /// `ErrGRPCPeerURLExist`: a member already uses one of the peer URLs.
    PEER_URL_EXIST = FailedPrecondition, "etcdserver: Peer URLs already exists";
    /// `ErrGRPCMemberNotEnoughStarted`: the change would leave too few started
    /// members for a quorum.
    MEMBER_NOT_ENOUGH_STARTED = FailedPrecondition,
        "etcdserver: re-configuration failed due to not enough started members";
    /// `ErrGRPCMemberBadURLs`: the peer URLs do not parse.
    MEMBER_BAD_URLS = InvalidArgument, "etcdserver: given member URLs are invalid";
    /// `ErrGRPCMemberNotFound`: no member with that ID.
    MEMBER_NOT_FOUND = NotFound, "etcdserver: member not found";
    /// `ErrGRPCMemberNotLearner`: promote of a member that is not a learner.
    MEMBER_NOT_LEARNER = FailedPrecondition, "etcdserver: can only promote a learner member";
    /// `ErrGRPCLearnerNotReady`: promote of a learner that lags the leader.
    LEARNER_NOT_READY = FailedPrecondition,
        "etcdserver: can only promote a learner member which is in sync with leader";
    /// `ErrGRPCTooManyLearners`: the cluster already has the maximum of learners.
    TOO_MANY_LEARNERS = FailedPrecondition, "etcdserver: too many learner members in cluster";

    // --- request admission ------------------------------------------------------

    /// `ErrGRPCRequestTooLarge`: the request exceeds etcd's request size limit.
    REQUEST_TOO_LARGE = InvalidArgument, "etcdserver: request is too large";
    /// `ErrGRPCRequestTooManyRequests`: the applied index lags the committed
    /// index too much to accept more proposals.
    TOO_MANY_REQUESTS = ResourceExhausted, "etcdserver: too many requests";

    // --- authentication ---------------------------------------------------------

    /// `ErrGRPCRootUserNotExist`: enabling auth without a root user.
    ROOT_USER_NOT_EXIST = FailedPrecondition, "etcdserver: root user does not exist";
    /// `ErrGRPCRootRoleNotExist`: enabling auth while root lacks the root role.
    ROOT_ROLE_NOT_EXIST = FailedPrecondition, "etcdserver: root user does not have root role";
    /// `ErrGRPCUserAlreadyExist`: the user name is taken.
    USER_ALREADY_EXIST = FailedPrecondition, "etcdserver: user name already exists";
    /// `ErrGRPCUserEmpty`: empty user name (also sent for a missing token user).
    USER_EMPTY = InvalidArgument, "etcdserver: user name is empty";
    /// `ErrGRPCUserNotFound`: no such user.
    USER_NOT_FOUND = FailedPrecondition, "etcdserver: user name not found";
    /// `ErrGRPCRoleAlreadyExist`: the role name is taken.
    ROLE_ALREADY_EXIST = FailedPrecondition, "etcdserver: role name already exists";
    /// `ErrGRPCRoleNotFound`: no such role.
    ROLE_NOT_FOUND = FailedPrecondition, "etcdserver: role name not found";
    /// `ErrGRPCRoleEmpty`: empty role name.
    ROLE_EMPTY = InvalidArgument, "etcdserver: role name is empty";
    /// `ErrGRPCAuthFailed`: wrong user name or password.
    AUTH_FAILED = InvalidArgument, "etcdserver: authentication failed, invalid user ID or password";
    /// `ErrGRPCPermissionNotGiven`: a role grant without a permission (3.5;
    /// not in etcd's client decode map).
    PERMISSION_NOT_GIVEN = InvalidArgument, "etcdserver: permission not given";
    /// `ErrGRPCPermissionDenied`: the user may not perform the request.
    PERMISSION_DENIED = PermissionDenied, "etcdserver: permission denied";
    /// `ErrGRPCRoleNotGranted`: revoking a role the user does not have.
    ROLE_NOT_GRANTED = FailedPrecondition, "etcdserver: role is not granted to the user";
    /// `ErrGRPCPermissionNotGranted`: revoking a permission the role does not have.
    PERMISSION_NOT_GRANTED = FailedPrecondition,
        "etcdserver: permission is not granted to the role";
    /// `ErrGRPCAuthNotEnabled`: an auth-only operation while auth is off.
    AUTH_NOT_ENABLED = FailedPrecondition, "etcdserver: authentication is not enabled";
    /// `ErrGRPCInvalidAuthToken`: the token is unknown or expired.
    INVALID_AUTH_TOKEN = Unauthenticated, "etcdserver: invalid auth token";
    /// `ErrGRPCInvalidAuthMgmt`: an auth change that is not allowed (e.g.
    /// removing root's root role while auth is on).
    INVALID_AUTH_MGMT = InvalidArgument, "etcdserver: invalid auth management";
    /// `ErrGRPCAuthOldRevision`: the token predates the current auth store
    /// revision; clients re-authenticate on it.
    AUTH_OLD_REVISION = InvalidArgument, "etcdserver: revision of auth store is old";

    // --- server and raft state --------------------------------------------------

    /// `ErrGRPCNoLeader`: the member currently has no leader.
    NO_LEADER = Unavailable, "etcdserver: no leader";
    /// `ErrGRPCNotLeader`: a leader-only operation sent to a follower.
    NOT_LEADER = FailedPrecondition, "etcdserver: not leader";
    /// `ErrGRPCLeaderChanged`: leadership changed while the request waited.
    LEADER_CHANGED = Unavailable, "etcdserver: leader changed";
    /// `ErrGRPCNotCapable`: the cluster version does not support the request.
    NOT_CAPABLE = Unavailable, "etcdserver: not capable";
    /// `ErrGRPCStopped`: the server is shutting down.
    STOPPED = Unavailable, "etcdserver: server stopped";
    /// `ErrGRPCTimeout`: the proposal did not complete in time.
    TIMEOUT = Unavailable, "etcdserver: request timed out";
    /// `ErrGRPCTimeoutDueToLeaderFail`: timed out, probably because the
    /// previous leader failed.
    TIMEOUT_DUE_TO_LEADER_FAIL = Unavailable,
        "etcdserver: request timed out, possibly due to previous leader failure";
    /// `ErrGRPCTimeoutDueToConnectionLost`: timed out, probably because the
    /// connection to the leader was lost.
    TIMEOUT_DUE_TO_CONNECTION_LOST = Unavailable,
        "etcdserver: request timed out, possibly due to connection lost";
    /// `ErrGRPCTimeoutWaitAppliedIndex`: a linearizable read waited too long
    /// for the applied index.
    TIMEOUT_WAIT_APPLIED_INDEX = Unavailable,
        "etcdserver: request timed out, waiting for the applied index took too long";
    /// `ErrGRPCUnhealthy`: the change would make the cluster unhealthy.
    UNHEALTHY = Unavailable, "etcdserver: unhealthy cluster";
    /// `ErrGRPCCorrupt`: a CORRUPT alarm is raised.
    CORRUPT = DataLoss, "etcdserver: corrupt cluster";
    /// `ErrGPRCNotSupportedForLearner` (sic in etcd): the RPC cannot be served
    /// by a learner.
    GRPC_NOT_SUPPORTED_FOR_LEARNER = Unavailable, "etcdserver: rpc not supported for learner";
    /// `ErrGRPCBadLeaderTransferee`: MoveLeader to a member that cannot lead.
    BAD_LEADER_TRANSFEREE = FailedPrecondition, "etcdserver: bad leader transferee";

    // --- downgrade (3.5) ----------------------------------------------------------

    /// `ErrGRPCClusterVersionUnavailable`: no cluster version is known yet.
    CLUSTER_VERSION_UNAVAILABLE = Unavailable,
        "etcdserver: cluster version not found during downgrade";
    /// `ErrGRPCWrongDowngradeVersionFormat`: the target is not "major.minor".
    WRONG_DOWNGRADE_VERSION_FORMAT = InvalidArgument,
        "etcdserver: wrong downgrade target version format";
    /// `ErrGRPCInvalidDowngradeTargetVersion`: the target is not one minor
    /// version below the cluster version.
    INVALID_DOWNGRADE_TARGET_VERSION = InvalidArgument,
        "etcdserver: invalid downgrade target version";
    /// `ErrGRPCDowngradeInProcess`: a downgrade is already running.
    DOWNGRADE_IN_PROCESS = FailedPrecondition,
        "etcdserver: cluster has a downgrade job in progress";
    /// `ErrGRPCNoInflightDowngrade`: cancel with no downgrade running.
    NO_INFLIGHT_DOWNGRADE = FailedPrecondition, "etcdserver: no inflight downgrade job";

    // --- request context (3.5) --------------------------------------------------

    /// `ErrGRPCCanceled`: the client canceled the request (not in etcd's
    /// client decode map).
    CANCELED = Cancelled, "etcdserver: request canceled";
    /// `ErrGRPCDeadlineExceeded`: the request deadline passed (not in etcd's
    /// client decode map).
    DEADLINE_EXCEEDED = DeadlineExceeded, "etcdserver: context deadline exceeded";
}

/// A `grpc-message` header value as sent: percent-encoded (the gRPC HTTP/2 protocol encodes
/// each byte outside printable ASCII as `%XX`, and some servers encode more). Anything that is
/// not a valid escape is kept as it is.
pub fn decode_grpc_message(raw: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && i + 2 < raw.len()
            && let (Some(hi), Some(lo)) = (hex(raw[i + 1]), hex(raw[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// etcd 3.7's RangeStream refuses a sort other than by key ascending (or none). etcd writes
/// these RangeStream refusals inline (`v3rpc/key.go`, `grpcproxy/kv.go`), outside its table:
/// they are not in [`ALL`] and clients do not decode them; their code, Unimplemented, is what
/// a client (kube-apiserver) takes as "use Range instead".
pub const RANGE_STREAM_SORT: EtcdError = EtcdError {
    code: Code::Unimplemented,
    message: "RangeStream does not support custom sort orders",
};
/// etcd 3.7's RangeStream refuses min/max mod and create revision filters.
pub const RANGE_STREAM_FILTERS: EtcdError = EtcdError {
    code: Code::Unimplemented,
    message: "RangeStream does not support revision filters",
};
/// etcd 3.7's gRPC proxy does not serve RangeStream, nor does ours.
pub const RANGE_STREAM_PROXY: EtcdError = EtcdError {
    code: Code::Unimplemented,
    message: "RangeStream is not supported by the gRPC proxy",
};

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn table_has_every_error_once() {
        assert_eq!(ALL.len(), 61);
        let messages: HashSet<_> = ALL.iter().map(|e| e.message).collect();
        assert_eq!(messages.len(), ALL.len(), "duplicate message in the table");
    }

    #[test]
    fn every_message_has_the_etcdserver_prefix() {
        for e in ALL {
            assert!(e.message.starts_with("etcdserver: "), "{e:?}");
            assert_ne!(e.code, Code::Ok, "{e:?}");
        }
    }

    #[test]
    fn from_message_round_trips() {
        for e in ALL {
            assert_eq!(from_message(e.message), Some(e));
            assert_eq!(EtcdError::from_message(e.message), Some(e));
            let status = e.to_status();
            assert_eq!(status.code(), e.code);
            assert_eq!(status.message(), e.message);
            assert_eq!(from_status(&status), Some(e));
        }
    }

    #[test]
    fn unknown_messages_are_not_decoded() {
        assert_eq!(from_message(""), None);
        assert_eq!(from_message("etcdserver: no leader "), None);
        assert_eq!(from_message("trying to send message larger than max"), None);
    }

    #[test]
    fn spot_checks_against_etcd() {
        assert_eq!(EMPTY_KEY.code, Code::InvalidArgument);
        assert_eq!(EMPTY_KEY.message, "etcdserver: key is not provided");
        assert_eq!(COMPACTED.code, Code::OutOfRange);
        assert_eq!(
            COMPACTED.message,
            "etcdserver: mvcc: required revision has been compacted"
        );
        assert_eq!(NO_SPACE.code, Code::ResourceExhausted);
        assert_eq!(
            NO_SPACE.message,
            "etcdserver: mvcc: database space exceeded"
        );
        assert_eq!(LEASE_NOT_FOUND.code, Code::NotFound);
        assert_eq!(
            PEER_URL_EXIST.message,
            "etcdserver: Peer URLs already exists"
        );
        assert_eq!(MEMBER_EXIST.message, "etcdserver: member ID already exist");
        assert_eq!(INVALID_AUTH_TOKEN.code, Code::Unauthenticated);
        assert_eq!(NO_LEADER.code, Code::Unavailable);
        assert_eq!(NOT_LEADER.code, Code::FailedPrecondition);
        assert_eq!(CORRUPT.code, Code::DataLoss);
        assert_eq!(REQUEST_TOO_LARGE.code, Code::InvalidArgument);
        assert_eq!(
            REQUEST_TOO_LARGE.message,
            "etcdserver: request is too large"
        );
        assert_eq!(
            GRPC_NOT_SUPPORTED_FOR_LEARNER.message,
            "etcdserver: rpc not supported for learner"
        );
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            decode_grpc_message(b"etcdserver:%20request%20is%20too%20large%"),
            "etcdserver: request is too large%"
        );
        assert_eq!(decode_grpc_message(b"100%zz"), "100%zz");
    }

    #[test]
    fn converts_into_status() {
        let status: tonic::Status = LEASE_EXIST.into();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "etcdserver: lease already exists");
        assert_eq!(TIMEOUT.to_string(), "etcdserver: request timed out");
    }
}
