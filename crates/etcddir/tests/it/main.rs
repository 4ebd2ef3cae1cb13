//! Integration tests of `etcdrs-etcddir` against data directories written by a real etcd 3.4
//! (`/usr/bin/etcd`), damaged copies of them, and directories that are not etcd's.

mod damaged;
mod fresh;
mod fuzz;
mod harness;
mod snapshot;
