//! The one place where server errors become gRPC statuses, with etcd's exact codes and
//! messages (etcd `api/v3rpc/util.go` `togRPCError`).

use etcdrs_proto::rpctypes;
use tonic::Status;

use crate::error::ServerError;

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Status {
        match e {
            ServerError::Etcd(err) => err.to_status(),
            ServerError::Mvcc(etcdrs_mvcc::Error::Compacted { .. }) => {
                rpctypes::COMPACTED.to_status()
            }
            ServerError::Mvcc(etcdrs_mvcc::Error::FutureRevision { .. }) => {
                rpctypes::FUTURE_REV.to_status()
            }
            ServerError::Mvcc(etcdrs_mvcc::Error::LeaseNotFound(_)) => {
                rpctypes::LEASE_NOT_FOUND.to_status()
            }
            ServerError::Mvcc(etcdrs_mvcc::Error::LeaseExists(_)) => {
                rpctypes::LEASE_EXIST.to_status()
            }
            ServerError::Raft(etcdrs_raftnode::Error::ProposalDropped) => {
                rpctypes::NO_LEADER.to_status()
            }
            ServerError::Stopped | ServerError::Raft(etcdrs_raftnode::Error::Stopped) => {
                rpctypes::STOPPED.to_status()
            }
            other => Status::unknown(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mvcc_errors_map_to_etcd_statuses() {
        let status: Status = ServerError::Mvcc(etcdrs_mvcc::Error::Compacted {
            requested: 1,
            compacted: 2,
        })
        .into();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let status: Status = ServerError::Mvcc(etcdrs_mvcc::Error::FutureRevision {
            requested: 9,
            current: 2,
        })
        .into();
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision is a future revision"
        );
        let status: Status = ServerError::Etcd(&rpctypes::EMPTY_KEY).into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "etcdserver: key is not provided");
    }
}
